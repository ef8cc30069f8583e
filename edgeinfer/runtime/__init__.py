"""The runtime: place a model's nodes on backends, compile the parts, serve it per shape signature.

- ``session``: the ``Session`` facade (check feeds, find the plan, run it); ``options``: the
  grouped settings (``RunOptions``, ``AutoOptions``, ``StreamOptions``, ``RayOptions``).
- ``feeds``: feed checking and shape ``Signature`` s.
- ``partition`` and ``placement``: which backend runs each node (the capability partition)
  and the backends made from names.
- ``compile``: partition and compile a graph into an executor, re-partitioning a part its
  backend cannot compile; ``parts``: ``CompiledPart`` and the one call of ``Backend.compile``.
- ``plans``: ``CompiledPlan`` (one signature's backends, partition, runner, stream plans)
  and the bounded, locked ``PlanCache`` that closes what it evicts.
- ``auto``: ``backend="auto"`` and ``executor="auto"``, measured per signature.
- ``fallback``: the first run's proving: a part that fails at run time is re-partitioned.
- ``executors`` (sequential, DAG) and ``stream/`` (the stage planner, the pipeline of stages
  over threads, the same plan as Ray actors): executors take plans, never a Session.

Submodules load on first use, so importing one (``edgeinfer.runtime.options`` from the CLI)
does not import the rest.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {"CompiledPlan": "plans", "PlanCache": "plans", "FeedChecker": "feeds", "Signature": "feeds",
            "Session": "session"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeinfer.runtime' has no attribute {name!r}")
    return getattr(import_module(f"edgeinfer.runtime.{module}"), name)
