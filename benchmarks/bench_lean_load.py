"""What a compiled ``.eim``'s cold start spends beside the engine (issue 38): the figures behind the
lean load's choices, each measured here.

- imports, each in a fresh process after ``numpy`` and the engine are already imported
  (median of ``--rounds``, interleaved): edgeinfer's compiled-load modules
  (``edgeinfer.runtime.session``, ``edgeinfer.format.lean``, the tflite backend), ``json`` alone,
  and OpenSSL's SHA-256 (``hashlib``), which the load no longer imports;
- checking an artifact's bytes, in this process, best of 5: CRC-32 (what format 3.6 records),
  BLAKE2b-256 and SHA-256 (OpenSSL), on each model's TFLite flatbuffer as ``ei.compile`` stores it.

Nothing else may run on the machine (the load average is printed with the table).

    python benchmarks/bench_lean_load.py [--rounds 7] [--only mediapipe/hand_landmark_full ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edgeinfer as ei  # noqa: E402
from tests.real.models_tflite import MODELS as TFLITE_MODELS  # noqa: E402

DEFAULT = ("mediapipe/face_landmark", "mediapipe/hand_landmark_full")
PRELUDE = "import time, numpy, ai_edge_litert.interpreter\nT = time.perf_counter()\n"
IMPORTS = {
    "edgeinfer compiled-load modules": "import edgeinfer.runtime.session, edgeinfer.format.lean, "
                                       "edgeinfer.backends.tflite.backend",
    "json": "import json",
    "hashlib (OpenSSL)": "import hashlib",
}


def import_ms(statement: str) -> float:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    code = PRELUDE + statement + "\nprint((time.perf_counter() - T) * 1e3)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)})
    return float(done.stdout.strip().splitlines()[-1])


def best_ms(fn, data: bytes, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(data)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def artifact_bytes(entry, folder: Path) -> bytes:
    model = ei.convert(entry.source())
    path = folder / (entry.id.replace("/", "_") + ".eim")
    compiled = ei.compile(model, path, backend="tflite", threads=2).compiled
    return bytes(compiled.artifact(0).data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", nargs="*", default=list(DEFAULT))
    args = parser.parse_args()
    by_id = {entry.id: entry for entry in TFLITE_MODELS}
    for statement in IMPORTS.values():  # untimed: byte-code caches written
        import_ms(statement)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    samples: dict[str, list[float]] = {label: [] for label in IMPORTS}
    for _ in range(args.rounds):
        for label, statement in IMPORTS.items():
            samples[label].append(import_ms(statement))
    print("\n| import (fresh process, numpy and LiteRT already imported) | median ms |\n|---|---|")
    for label, values in samples.items():
        print(f"| {label} | {statistics.median(values):.2f} |")
    checks = {"CRC-32 (zlib)": zlib.crc32, "BLAKE2b-256": lambda d: hashlib.blake2b(d, digest_size=32).digest(),
              "SHA-256 (OpenSSL)": lambda d: hashlib.sha256(d).digest()}
    print("\n| model | artifact MB | " + " | ".join(f"{name} ms" for name in checks) + " |")
    print("|---|---|" + "---|" * len(checks))
    with tempfile.TemporaryDirectory(prefix="lean-load-") as folder:
        for name in args.only:
            data = artifact_bytes(by_id[name], Path(folder))
            cells = " | ".join(f"{best_ms(fn, data):.2f}" for fn in checks.values())
            print(f"| {name} | {len(data) / 1e6:.2f} | {cells} |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
