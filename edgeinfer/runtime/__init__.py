"""The runtime: place a model's nodes on backends, compile the parts, serve it per shape signature.

- ``session``: the ``Session`` facade (check feeds, find the plan, hand it to an executor).
- ``feeds``: feed checking and shape ``Signature`` s.
- ``partition`` and ``placement``: which backend runs each node (the capability partition),
  the backends made from names, and the parts compiled for an executor.
- ``plans``: ``CompiledPlan`` (one signature's backends, partition, executor, stream plans)
  and the bounded, locked ``PlanCache`` that closes what it evicts.
- ``auto``: ``backend="auto"`` and ``executor="auto"``, measured per signature.
- ``fallback``: re-partition when a backend cannot compile or run a part it accepted.
- ``executors`` (sequential, DAG) and ``stream/`` (the stage planner, the pipeline of stages
  over threads, the same plan as Ray actors): executors take plans, never a Session.
"""

from edgeinfer.runtime.feeds import FeedChecker, Signature
from edgeinfer.runtime.plans import CompiledPlan, PlanCache
from edgeinfer.runtime.session import Session

__all__ = ["CompiledPlan", "FeedChecker", "PlanCache", "Session", "Signature"]
