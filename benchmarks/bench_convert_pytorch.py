"""Conversion time of the PyTorch front end on the test zoo and a full-size MobileNetV2.

Each model (``tests/converters/pytorch/pytorch_zoo.py``, random weights) is converted with
``ei.convert(module, example_inputs=...)`` (capture with ``torch.export``, op check, ONNX
export, import, type inference and edgeinfer's default passes) after one warm-up conversion
that pays PyTorch's one-time import and registry costs. Reports the median of ``--repeat``
conversions per model, static batch and (``--dynamic``) symbolic batch. The target of the
PyTorch converter issue is a MobileNetV2-sized model (3.5M parameters, 224x224) in under 5 s.

    .venv/bin/python benchmarks/bench_convert_pytorch.py [--models mobilenet_v2_224 resnet18_style]
        [--repeat 3] [--dynamic] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "converters" / "pytorch"))

import torch  # noqa: E402
from pytorch_zoo import MOBILENET_V2_224, ZOO, ZooEntry  # noqa: E402

import edgeinfer as ei  # noqa: E402

ENTRIES: dict[str, ZooEntry] = {**ZOO, MOBILENET_V2_224.name: MOBILENET_V2_224}
TARGET_S = {MOBILENET_V2_224.name: 5.0}


def time_conversion(entry: ZooEntry, *, dynamic: bool, repeat: int) -> dict[str, Any]:
    module = entry.model()
    example = entry.inputs(1)
    seconds, model = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        model = ei.convert(module, example_inputs=example, input_names=list(entry.input_names),
                           dynamic_batch=dynamic)
        seconds.append(time.perf_counter() - start)
    parameters = sum(p.numel() for p in module.parameters())
    return {"model": entry.name, "dynamic_batch": dynamic, "parameters": parameters,
            "nodes": len(model.graph.nodes), "median_s": statistics.median(seconds), "runs_s": seconds,
            "target_s": TARGET_S.get(entry.name)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(ENTRIES), choices=list(ENTRIES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dynamic", action="store_true", help="also convert with a symbolic batch")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ei.convert(ZOO["mlp"].model(), example_inputs=ZOO["mlp"].inputs(1))  # warm-up: imports, torchlib registry
    results = []
    print(f"{'model':24} {'batch':8} {'params':>10} {'nodes':>6} {'median s':>9}  target")
    for name in args.models:
        for dynamic in (False, True) if args.dynamic else (False,):
            row = time_conversion(ENTRIES[name], dynamic=dynamic, repeat=args.repeat)
            results.append(row)
            target = ""
            if row["target_s"] is not None:
                verdict = "met" if row["median_s"] < row["target_s"] else "MISSED"
                target = f"< {row['target_s']:.0f} s {verdict}"
            print(f"{name:24} {'N' if dynamic else '1':8} {row['parameters']:>10,} {row['nodes']:>6} "
                  f"{row['median_s']:>9.2f}  {target}")
    if args.json:
        environment = {"python": platform.python_version(), "torch": torch.__version__,
                       "cpus": os.cpu_count(), "load_average": os.getloadavg()}
        args.json.write_text(json.dumps({"environment": environment, "results": results}, indent=2))


if __name__ == "__main__":
    main()
