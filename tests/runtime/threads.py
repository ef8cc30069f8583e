"""Which threads belong to the scheduler (DAG workers, pipeline stages, run_async), so tests can
check that close() leaves none behind. The numpy backend's helper pool is process-wide by
design (like a BLAS pool) and is not the scheduler's."""

from __future__ import annotations

import threading

SCHEDULER_PREFIXES = ("edgeinfer-dag", "edgeinfer-stage", "edgeinfer-async")


def edgeinfer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(SCHEDULER_PREFIXES)]
