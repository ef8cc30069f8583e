"""INT8 file size relative to fp32: edgeinfer's .eim against onnxruntime's QDQ ONNX.

For the CNN trained on scikit-learn's digits (tests/quantize/digits_model.py), and optionally
zoo models (``--zoo mobilenet_v2 resnet50``, calibrated on random inputs, which is enough for
sizes), in one run:

- ``.eim``: the level-2 fp32 model and ``quantize_static`` of it (default method), saved;
- ``.onnx``: the level-1 fp32 graph and onnxruntime's ``quantize_static`` of it (QDQ,
  per-channel int8 weights, uint8 activations), on the same calibration samples.

Prints each file's size, the INT8/fp32 ratio of each tool, and where the bytes of each .eim
go (``edgeinfer.format.sizes``, also shown by ``edgeinfer inspect``). Usage::

    python benchmarks/eim_sizes.py [--zoo mobilenet_v2] [--json sizes.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

import edgeinfer as ei
from devkit import zoo
from edgeinfer.format.sizes import size_breakdown
from edgeinfer.quantize.static import calibrate, quantize_static

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quantize import ort_quantize_static  # noqa: E402

ZOO = {"mobilenet_v2": lambda: zoo.mobilenet_v2(size=224), "resnet50": lambda: zoo.resnet50(size=224)}


def digits() -> tuple[ei.Model, ei.Model, list[dict[str, np.ndarray]]]:
    """(level-1 fp32, level-2 fp32, calibration batches) of the digits CNN."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "quantize"))
    from digits_model import digits_task

    task = digits_task()
    batches = [{"image": task.train_x[i:i + 64]} for i in range(0, 512, 64)]
    return ei.convert(task.model, optimize=1), ei.convert(task.model, optimize=2), batches


def zoo_model(name: str) -> tuple[ei.Model, ei.Model, list[dict[str, np.ndarray]]]:
    source = ZOO[name]()
    level1, level2 = ei.convert(source, optimize=1), ei.convert(source, optimize=2)
    value = level2.graph.inputs[0]
    shape = [1 if not isinstance(d, int) else d for d in value.shape]
    rng = np.random.default_rng(0)
    batches = [{value.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    return level1, level2, batches


def measure(name: str, level1: ei.Model, level2: ei.Model, batches: list, folder: Path) -> dict:
    fp32_eim, int8_eim = folder / f"{name}_fp32.eim", folder / f"{name}_int8.eim"
    level2.save(fp32_eim)
    quantize_static(level2, calibrate(level2, batches)).save(int8_eim)
    ort_quantize_static(level1, batches, folder)
    fp32_onnx, int8_onnx = folder / "fp32.onnx", folder / "ort_int8.onnx"
    sizes = {"fp32.eim": fp32_eim.stat().st_size, "int8.eim": int8_eim.stat().st_size,
             "fp32.onnx": fp32_onnx.stat().st_size, "ort_int8.onnx": int8_onnx.stat().st_size}
    result = {"sizes": sizes, "eim_ratio": sizes["int8.eim"] / sizes["fp32.eim"],
              "ort_ratio": sizes["ort_int8.onnx"] / sizes["fp32.onnx"],
              "breakdown": {path.name: size_breakdown(path).lines() for path in (fp32_eim, int8_eim)}}
    print(f"\n{name}")
    for file, size in sizes.items():
        print(f"  {file:14s} {size:>12,} bytes")
    print(f"  INT8/fp32: edgeinfer .eim {result['eim_ratio']:.4f}, onnxruntime QDQ .onnx {result['ort_ratio']:.4f}")
    for file, lines in result["breakdown"].items():
        print(f"  {file}:")
        for line in lines:
            print(f"    {line}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", nargs="*", default=[], choices=sorted(ZOO))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        results["digits"] = measure("digits", *digits(), Path(folder))
        for name in args.zoo:
            results[name] = measure(name, *zoo_model(name), Path(folder))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
