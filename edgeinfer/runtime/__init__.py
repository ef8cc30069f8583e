"""The runtime: serve a model per shape signature.

- ``session``: the ``Session`` facade (check feeds, find the plan, hand it to an executor).
- ``feeds``: feed checking and shape ``Signature`` s.
- ``plans``: ``CompiledPlan`` (one signature's backends, partition, executor, stream plans)
  and the bounded, locked ``PlanCache`` that closes what it evicts.
- ``auto``: ``backend="auto"`` and ``executor="auto"``, measured per signature.
- ``fallback``: re-partition when a backend cannot compile or run a part it accepted.
- ``executors`` (sequential, DAG), ``pipeline`` (streams), ``ray`` (stages as Ray actors):
  executors take plans, never a Session.
"""

from edgeinfer.runtime.feeds import FeedChecker, Signature
from edgeinfer.runtime.plans import CompiledPlan, PlanCache
from edgeinfer.runtime.session import Session

__all__ = ["CompiledPlan", "FeedChecker", "PlanCache", "Session", "Signature"]
