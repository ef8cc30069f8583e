"""``ei.quantize(model, samples)`` with every default, on the corpus detectors and landmark models:
does the default guard keep the task (issue 39's INT8 targets)?

    python benchmarks/bench_int8_default.py                     # the four models below
    python benchmarks/bench_int8_default.py --models nudenet/320n --json int8_default.json

For each model: calibration on ``tests/quantize/real_tasks.py``'s calibration views (``--per-photo``
views per photo), then, on its held-out views, against fp32 on onnxruntime: the SQNR of every
output, part by part where an output concatenates parts of different magnitude (a detector's
boxes and class scores: ``guard.output_quality``'s rule), the task metric, and for the face mesh
the mean landmark distance in pixels at its 192-pixel input. Beside them: whether the default
escalated to mixed precision (and the layers, weight bytes and FLOPs share it kept float), and
the seconds ``quantize`` took. Targets: every output (part) >= 15 dB, landmarks <= 1.5 px mean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "quantize"))
sys.path.insert(0, str(ROOT))  # the repository root: devkit/ is not installed

import numpy as np  # noqa: E402

import edgeinfer as ei  # noqa: E402
from edgeinfer.quantize.guard import concat_parts  # noqa: E402

MODELS = ("nudenet/320n", "face_detection_short_range", "face_landmark", "ppocrv4_det")
BACKENDS = ("onnxruntime", "numpy")
LANDMARKS = "conv2d_21"  # face_landmark: 468 x (x, y, z) in input pixels


def run(model: ei.Model, feeds: list[dict], backend: str) -> list[dict]:
    with ei.Session(model, backend=backend) as session:
        return [session.run(f) for f in feeds]


def sqnr_db(reference: np.ndarray, got: np.ndarray) -> float:
    noise = float(((reference.astype(np.float64) - got) ** 2).sum())
    return float("inf") if noise == 0 else 10 * np.log10(float((reference.astype(np.float64) ** 2).sum()) / noise)


def part_sqnr(model: ei.Model, reference: list[dict], got: list[dict]) -> dict[str, float]:
    """SQNR per output, and per part of a concatenated output (every part, whatever its scale)."""
    found = {}
    for name in reference[0]:
        ref = np.concatenate([r[name] for r in reference])
        out = np.concatenate([g[name] for g in got])
        found[name] = round(sqnr_db(ref, out), 2)
        for axis, start, stop in concat_parts(model.graph, name):
            index = [slice(None)] * ref.ndim
            index[axis] = slice(start, stop)
            found[f"{name}[{start}:{stop}]@{axis}"] = round(sqnr_db(ref[tuple(index)], out[tuple(index)]), 2)
    return found


def landmark_pixels(reference: list[dict], got: list[dict]) -> float:
    distances = [np.linalg.norm(r[LANDMARKS].reshape(-1, 3)[:, :2] - g[LANDMARKS].reshape(-1, 3)[:, :2], axis=1).mean()
                 for r, g in zip(reference, got)]
    return round(float(np.mean(distances)), 3)


def measure(name: str, per_photo: int) -> dict:
    from real_tasks import TASKS

    task = TASKS[name]
    fp32 = task.fp32()
    calibration, held_out = task.calibration(per_photo), task.held_out(per_photo)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        int8 = ei.quantize(fp32, calibration)
    row = {"model": name, "calibration views": len(calibration), "held-out views": len(held_out),
           "quantize s": round(time.perf_counter() - start, 1)}
    escalated = json.loads(int8.metadata["quantization"]).get("escalated")
    row["escalated"] = None if escalated is None else {
        key: escalated[key] for key in ("reason", "float_layers", "quantizable_layers", "float_flops_share",
                                        "file_bytes", "plain_int8_file_bytes", "fp32_file_bytes", "held_out_worst_db")}
    reference = run(fp32, held_out, "onnxruntime")
    for backend in BACKENDS:
        got = run(int8, held_out, backend)
        row[f"{backend} SQNR dB"] = part_sqnr(fp32, reference, got)
        row[f"{backend} {task.metric_name}"] = round(float(task.metric(reference, got)), 4)
        if LANDMARKS in reference[0]:
            row[f"{backend} landmark px"] = landmark_pixels(reference, got)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--per-photo", type=int, default=1, help="calibration and held-out views per photo")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, "
          f"{os.cpu_count()} cores", flush=True)
    rows = []
    for name in args.models:
        rows.append(measure(name, args.per_photo))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
