"""Where OpenVINO loses YOLOv8n's INT8 box sizes: a reproduction, with the figures that localize it.

The corpus' YOLOv8n (nudenet 320n) quantized by edgeinfer's static INT8 runs on onnxruntime,
numpy and tflite at 31-36 dB output SQNR against fp32, on OpenVINO at about 16 dB (the SQNR
column of ``bench_int8_real.py``). This script measures, on the task's held-out views, the box
rows of ``output0`` against fp32 on onnxruntime:

- ``SQNR`` and mean absolute error (pixels) of the centers (cx, cy) and sizes (w, h);
- for the full INT8 model on onnxruntime and OpenVINO, and on OpenVINO with its low-precision
  transformations off (the internal ``LP_TRANSFORMS_MODE=False``: the dequantized graph in float);
- for a model where only the head's stride-32 Concat of box and class logits is quantized
  (``--only NAME``: any one layer), the smallest trigger found by bisection over the head.

    python benchmarks/diagnose_openvino_yolo.py [--views 6] [--only /model.22/Concat_2]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "quantize"))

from real_tasks import TASKS, sqnr_db  # noqa: E402

import edgeinfer as ei  # noqa: E402
from edgeinfer.backend import CompileOptions  # noqa: E402
from edgeinfer.quantize.static import calibrate, quantizable_layers, quantize_static  # noqa: E402


def box_errors(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """SQNR (dB) and mean absolute error (pixels) of the centers and sizes of every anchor's box."""
    rows = {"centers": slice(0, 2), "sizes": slice(2, 4)}
    return {f"{part} {kind}": round(float(value), 2) for part, cut in rows.items()
            for kind, value in (("dB", sqnr_db(reference[:, cut], got[:, cut])),
                                ("px", float(np.abs(reference[:, cut] - got[:, cut]).mean())))}


def openvino_outputs(graph: ei.Graph, feeds: list[dict], config: dict | None = None) -> np.ndarray:
    from edgeinfer.backends.openvino.backend import OpenVinoBackend

    executable = OpenVinoBackend(device="cpu", config=config or {}).compile(graph, CompileOptions(threads=2))
    return np.concatenate([executable.run(f)["output0"] for f in feeds], axis=-1)


def session_outputs(model: ei.Model, feeds: list[dict], backend: str) -> np.ndarray:
    session = ei.Session(model, backend=backend)
    return np.concatenate([session.run(f)["output0"] for f in feeds], axis=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=6, help="held-out views (of the task's 12 at --per-photo 1)")
    parser.add_argument("--only", default="/model.22/Concat_2", help="the one layer quantized in the last rows")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    task = TASKS["nudenet/320n"]
    fp32 = task.fp32()
    calibration = calibrate(fp32, task.calibration(1))
    feeds = task.held_out(1)[:args.views]
    reference = session_outputs(fp32, feeds, "onnxruntime")
    full = quantize_static(fp32, calibration)
    only = quantize_static(fp32, calibration, exclude=[name for name in quantizable_layers(calibration)
                                                       if name != args.only])
    rows = {
        "INT8, onnxruntime": session_outputs(full, feeds, "onnxruntime"),
        "INT8, openvino": openvino_outputs(full.graph, feeds),
        "INT8, openvino, LP_TRANSFORMS_MODE=False": openvino_outputs(full.graph, feeds, {"LP_TRANSFORMS_MODE": False}),
        f"only {args.only} quantized, onnxruntime": session_outputs(only, feeds, "onnxruntime"),
        f"only {args.only} quantized, openvino": openvino_outputs(only.graph, feeds),
    }
    print(f"YOLOv8n (nudenet 320n), {len(feeds)} held-out views: box rows of output0 against fp32 on onnxruntime")
    for label, got in rows.items():
        print(f"{label:56s} {box_errors(reference, got)}")


if __name__ == "__main__":
    main()
