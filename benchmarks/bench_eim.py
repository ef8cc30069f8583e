"""Save and load time of .eim files, and proof that loading maps weights instead of copying.

For each weight size: build a graph with 64 float32 initializers of that total size, save it
(atomic, fsync'd), then load it and read one element of every tensor. Load time should not grow
with the weight size, because the tensors are views into a memory map. Usage::

    python benchmarks/bench_eim.py [--sizes-mib 16 256 1024] [--folder DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import edgeinfer as ei
from edgeinfer.ir import Graph, Node, Value


def build(total_mib: int, tensors: int = 64) -> ei.Model:
    per = total_mib * 1024 * 1024 // 4 // tensors
    rng = np.random.default_rng(0)
    inits = {f"w{i}": rng.standard_normal(per, dtype=np.float32) for i in range(tensors)}
    nodes = [Node("Add", ["x", "w0"], ["y"])]
    graph = Graph(nodes, [Value("x", "float32", (per,))], [Value("y", "float32", (per,))], inits,
                  opset={"": 17})
    return ei.Model(graph)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--folder", type=Path, help="where to write the files (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        print(f"{'weights':>10} {'save s':>8} {'MiB/s':>8} {'load ms':>8}  zero-copy")
        for size in args.sizes_mib:
            model = build(size)
            path = Path(folder) / f"w{size}.eim"
            start = time.perf_counter()
            model.save(path)
            save_s = time.perf_counter() - start
            del model
            start = time.perf_counter()
            loaded = ei.load(path)
            touched = sum(float(a[0]) for a in loaded.graph.initializers.values())
            load_ms = (time.perf_counter() - start) * 1000
            mapped = all(not a.flags.writeable and not a.flags.owndata for a in loaded.graph.initializers.values())
            print(f"{size:>7} MiB {save_s:8.2f} {size / save_s:8.0f} {load_ms:8.2f}  {mapped} ({touched:.1f})")
            del loaded
            path.unlink()


if __name__ == "__main__":
    main()
