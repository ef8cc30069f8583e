"""Time to first result in a fresh process, for ``ei.compile(backend="auto")``.

Auto races its candidates warm, in the process that compiles. On a device the first result also
pays for importing the chosen engine and loading its artifact: OpenVINO plans that won warm on
PP-OCRv4 det and rec, Inception v1 and DenseNet-121 gave their first result in 0.36-0.49 s where
onnxruntime's took 0.21-0.26 s (``benchmarks/bench_auto_decide.py``, its ``first_result_s``). So when auto's warm winner is not
the native engine (the engine of the file the user had), ``compile`` writes both compiled files,
starts each in fresh processes, interleaved (one untimed round first: byte-code and page caches),
and keeps the warm winner only if its first result is within ``COLD_MARGIN`` of the native
engine's; else the native engine is kept, and the reason says what each costs, cold and warm.
``AutoOptions(cold_start=False)`` leaves the first result out (a server that loads once).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.log import get_logger

log = get_logger("edgeinfer.runtime.coldstart")
COLD_MARGIN = 0.10  # the warm winner's first result may take this much longer than the native engine's
ROUNDS = 3
_CHILD = ("import time\nT0 = time.perf_counter()\nimport sys\nimport numpy as np\nimport edgeinfer as ei\n"
          "s = ei.Session(sys.argv[1], threads=None if sys.argv[3] == '-' else int(sys.argv[3]))\n"
          "with np.load(sys.argv[2]) as stored:\n"
          "    feeds = {info.name: stored[f'arr_{k}'] for k, info in enumerate(s.model.inputs)}\n"
          "s.run(feeds)\nprint(time.perf_counter() - T0)\n")


def first_results(files: Mapping[str, Path], feeds: Sequence[Any], threads: int | None,
                  rounds: int = ROUNDS) -> dict[str, float]:
    """label -> median seconds from process start (after Python's own start-up) to the first
    result of ``ei.Session(file).run``; inf for a file whose process fails. Stops after a timed
    round where the two files' times do not overlap even with ``COLD_MARGIN`` (``_settled``)."""
    import numpy as np

    folder = next(iter(files.values())).parent
    feeds_path = folder / f".{next(iter(files.values())).stem}.coldstart-feeds.npz"
    try:
        np.savez(feeds_path, *[np.asarray(f) for f in feeds])
        times: dict[str, list[float]] = {label: [] for label in files}
        for round_index in range(rounds + 1):
            for label, path in files.items():
                took = _child(path, feeds_path, threads)
                if round_index:  # the first round is untimed
                    times[label].append(took)
            if round_index and _settled(times):
                break
        return {label: statistics.median(found) for label, found in times.items()}
    finally:
        feeds_path.unlink(missing_ok=True)


def _settled(times: Mapping[str, list[float]], margin: float = COLD_MARGIN) -> bool:
    """Whether every time of one file is beyond every time of the other (the slower side by more
    than ``margin``): more rounds would not change the decision."""
    if len(times) != 2:
        return False
    (_, a), (_, b) = times.items()
    return min(a) > max(b) * (1 + margin) or min(b) > max(a) * (1 + margin)


def _child(path: Path, feeds_path: Path, threads: int | None) -> float:
    import edgeinfer

    root = str(Path(edgeinfer.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(feeds_path),
                               "-" if threads is None else str(threads)],
                              capture_output=True, text=True, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        return float("inf")
    if done.returncode != 0:
        log.warning("cold start of %s failed: %s", path, (done.stderr.strip().splitlines() or ["?"])[-1][:200])
        return float("inf")
    return float(done.stdout.strip().splitlines()[-1])


def weigh(choice: Any, cold: Mapping[str, float], margin: float = COLD_MARGIN) -> tuple[bool, str]:
    """Whether auto's warm winner stays (else the native engine is kept), and the reason to
    record. ``cold``: {"auto": seconds, "native": seconds} to the first result."""
    winner, native = ",".join(choice.backends), choice.native
    mine, theirs = cold["auto"], cold["native"]
    warm = choice.median_ms
    faster = warm[native] / warm[winner] if warm.get(winner) else float("inf")
    figures = f"first result in a fresh process {mine:.3g} s against the native engine's {theirs:.3g} s"
    if mine <= theirs * (1 + margin):
        return True, f"{choice.reason}; {figures} (within {margin:.0%})"
    return False, (f"the native engine {native}, kept: {winner} is {faster:.2f}x faster warm, but its {figures} "
                   f"(over the {margin:.0%} margin; AutoOptions(cold_start=False) weighs warm latency alone)")
