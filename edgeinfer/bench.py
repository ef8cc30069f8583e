"""``edgeinfer bench``: measure a model on this device, backend by backend, in one process.

Latency: every contender is compiled first, then timed in interleaved rounds
(``edgeinfer.benchmark.time_interleaved``) so machine noise hits them alike. Streams: the
pipeline planner's plan for the session, and its throughput beside the same session serving
the same requests one after another.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgeinfer.benchmark import time_interleaved
from edgeinfer.model import Model


@dataclass
class LatencyReport:
    backend: str
    compile_s: float
    first_run_ms: float
    ms: dict[str, float]  # min, median, p90, p99, max
    throughput: float  # requests per second at median latency
    plan: str
    auto_choice: list[str] | None = None


@dataclass
class StreamReport:
    backend: str
    requests: int
    plan: str
    stages: int
    replicas: list[int]
    planning_s: float
    stream_per_s: float
    sequential_per_s: float
    speedup: float = field(init=False)

    def __post_init__(self) -> None:
        self.speedup = self.stream_per_s / self.sequential_per_s if self.sequential_per_s else float("nan")


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"min": float(ms.min()), "median": float(np.median(ms)), "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}


def latency(model: Model, backends: Sequence[str | list[str]], feeds: Mapping[str, Any], *, threads: int | None,
            runs: int, warmup: int, **session_options: Any) -> list[LatencyReport]:
    from edgeinfer.session import Session

    sessions, compile_s, first_ms = {}, {}, {}
    for backend in backends:
        label = backend if isinstance(backend, str) else "+".join(backend)
        start = time.perf_counter()
        session = Session(model, backend=backend, threads=threads, **session_options)
        compile_s[label] = time.perf_counter() - start
        start = time.perf_counter()
        session.run(feeds)
        first_ms[label] = (time.perf_counter() - start) * 1000
        sessions[label] = session
    try:
        times = time_interleaved({label: (lambda s=s: s.run(feeds)) for label, s in sessions.items()},
                                 rounds=runs, warmup=warmup)
        reports = []
        for label, session in sessions.items():
            stats = percentiles(times[label])
            choice = session.auto_choice.backends if session.auto_choice is not None else None
            reports.append(LatencyReport(label, compile_s[label], first_ms[label], stats, 1000 / stats["median"],
                                         session.plan.describe(), choice))
        return reports
    finally:
        for session in sessions.values():
            session.close()


def stream(model: Model, backend: str | list[str], feeds: Mapping[str, Any], *, threads: int | None,
           requests: int, stages: int | str, replicas: Any = "auto", **session_options: Any) -> StreamReport:
    """Throughput of ``requests`` copies of ``feeds`` through the planned pipeline, beside the same
    session running them one after another (each figure the better of two alternating runs)."""
    from edgeinfer.session import Session

    label = backend if isinstance(backend, str) else "+".join(backend)
    with Session(model, backend=backend, threads=threads, **session_options) as session:
        start = time.perf_counter()
        plan = session.pipeline_plan(feeds, stages=stages, replicas=replicas)  # the stream below reuses it
        planning = time.perf_counter() - start

        def pipelined() -> None:
            for _ in session.stream((feeds for _ in range(requests)), stages=stages, replicas=replicas):
                pass

        def sequential() -> None:
            for _ in range(requests):
                session.run(feeds)

        times = time_interleaved({"stream": pipelined, "sequential": sequential}, rounds=2, warmup=1)
    return StreamReport(label, requests, plan.describe(), len(plan.stages), plan.replicas, planning,
                        requests / min(times["stream"]), requests / min(times["sequential"]))


def machine_facts() -> dict[str, Any]:
    from importlib import metadata

    versions = {}
    for name in ("edgeinfer", "numpy", "onnx", "onnxruntime", "openvino", "ai-edge-litert", "tflite-runtime"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"machine": platform.machine(), "processor": platform.processor(), "system": platform.platform(),
            "python": platform.python_version(), "cpus": os.cpu_count(), "versions": versions}


def as_json(latency_reports: Sequence[LatencyReport], stream_report: StreamReport | None) -> dict[str, Any]:
    return {"machine": machine_facts(), "latency": [asdict(r) for r in latency_reports],
            "stream": asdict(stream_report) if stream_report is not None else None}
