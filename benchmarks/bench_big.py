"""Models past 2 GB (issue 25): a 3 GiB ONNX model with external data, made here, through every
step in a fresh process each, with wall time and peak resident memory (ru_maxrss) per step.

    python benchmarks/bench_big.py                       # 3 x MatMul 8192x32768 float32 = 3 GiB
    python benchmarks/bench_big.py --k 2048 --n 8192     # a quick 192 MiB run
    python benchmarks/bench_big.py --keep --dir /big     # keep the files

Steps: ``make`` (the model, written in chunks), ``ort`` (onnxruntime loads the original and runs
once: the reference), ``convert`` (``ei.convert`` + ``Model.save`` to .eim), ``load`` (``ei.load``
of the .eim), ``hash`` (``Graph.content_hash()`` of the loaded .eim, backend="auto"'s cache
key: time, peak and resident memory after), ``run-numpy`` and ``run-onnxruntime`` (load + first run, compared with the
reference; the onnxruntime step also says how many MiB of weights reached onnxruntime by file
reference into the .eim and how many in memory), ``run-onnxruntime-prepack`` (the same with
``prepack=True``; not run by default), ``quantize-int4`` (``ei.quantize(weights="int4",
mode="weight_only", block_size=32)`` of the mapped .eim + save: time, and peak memory against
the float32 weights), ``int4`` (file size of that .eim against fp32, made here if
``quantize-int4`` did not run; relative error of the matrix products against fp32 on random data), ``latency`` (onnxruntime fp32 vs int4 at batch
1, interleaved in one process), ``int4-error`` (needs no files: int4 error of matrix products on
random Gaussian and uniform weights for blocks 32/64/128, with and without zero points, round to
nearest and with a per-block clip search, next to the rate-distortion floor at that many bits
per weight; ``--only int4-error`` runs it alone).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LAYERS = 3


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _feeds(k: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)}


def step_make(folder: Path, k: int, n: int) -> dict:
    """x[1, K] -> MatMul(W0 [K, N]) -> MatMul(W1 [N, K]) -> MatMul(W2 [K, N]) -> y, weights in
    one external data file written a chunk at a time (the maker never holds a whole weight)."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    shapes = [(k, n), (n, k), (k, n)][:LAYERS]
    data = folder / "big.onnx.data"
    initializers, offset = [], 0
    with open(data, "wb") as handle:
        for index, (rows, cols) in enumerate(shapes):
            scale = np.float32(1.0 / np.sqrt(rows))
            for start in range(0, rows, 1024):
                block = rng.standard_normal((min(1024, rows - start), cols), dtype=np.float32) * scale
                handle.write(block.tobytes())
            tensor = onnx.TensorProto(name=f"w{index}", data_type=TensorProto.FLOAT, dims=[rows, cols],
                                      data_location=TensorProto.EXTERNAL)
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(rows * cols * 4))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += rows * cols * 4
            initializers.append(tensor)
    names = ["x", "h0", "h1", "y"][: LAYERS + 1]
    names[-1] = "y"
    nodes = [helper.make_node("MatMul", [names[i], f"w{i}"], [names[i + 1]]) for i in range(LAYERS)]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, shapes[-1][1]])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (folder / "big.onnx").write_bytes(model.SerializeToString())
    return {"weights_gib": offset / 2**30}


def step_ort(folder: Path, k: int, n: int) -> dict:
    import onnxruntime as ort

    start = time.perf_counter()
    session = ort.InferenceSession(os.fspath(folder / "big.onnx"), providers=["CPUExecutionProvider"])
    loaded = time.perf_counter() - start
    y = session.run(None, _feeds(k))[0]
    np.save(folder / "reference.npy", y)
    return {"load_s": loaded, "load_and_run_s": time.perf_counter() - start}


def step_convert(folder: Path, k: int, n: int) -> dict:
    import edgeinfer as ei

    start = time.perf_counter()
    model = ei.convert(folder / "big.onnx")
    converted = time.perf_counter() - start
    model.save(folder / "big.eim")
    return {"convert_s": converted, "convert_and_save_s": time.perf_counter() - start}


def step_load(folder: Path, k: int, n: int) -> dict:
    import edgeinfer as ei

    start = time.perf_counter()
    import edgeinfer.format.eim  # noqa: F401  what a load imports (onnx and ml_dtypes among them), timed apart
    imports = time.perf_counter() - start
    before = _peak_mib()
    start = time.perf_counter()
    model = ei.load(folder / "big.eim")
    took = time.perf_counter() - start
    import psutil

    return {"load_s": took, "imports_s": imports, "rss_after_load_mib": psutil.Process().memory_info().rss / 2**20,
            "peak_before_load_mib": before, "nodes": len(model.graph.nodes)}


def step_hash(folder: Path, k: int, n: int) -> dict:
    """``Graph.content_hash()`` of the mapped .eim (the key of backend="auto"'s plan cache)."""
    import psutil

    import edgeinfer as ei

    graph = ei.load(folder / "big.eim").graph
    before = _peak_mib()
    start = time.perf_counter()
    graph.content_hash()
    return {"hash_s": time.perf_counter() - start, "peak_before_mib": before,
            "rss_after_mib": psutil.Process().memory_info().rss / 2**20}


def _run(folder: Path, k: int, backend: str, name: str = "big.eim", **engine) -> dict:
    import edgeinfer as ei

    start = time.perf_counter()
    with ei.Session(ei.load(folder / name), backend=backend, threads=2, **engine) as session:
        compiled = time.perf_counter() - start
        y = session.run(_feeds(k))["y"]
        weights = session.stats().get("weights")  # onnxruntime: how the weights got there
    reference = np.load(folder / "reference.npy")
    error = float(np.abs(y - reference).max() / max(np.abs(reference).max(), 1e-30))
    out = {"compile_s": compiled, "first_run_s": time.perf_counter() - start,
           "max_error_relative_to_max": error, "within_1e-4": error <= 1e-4}
    if weights:
        out["weights_by"] = {route: weights[route]["bytes"] / 2**20 for route in ("file", "memory", "protobuf")}
    return out


def step_run_numpy(folder: Path, k: int, n: int) -> dict:
    return _run(folder, k, "numpy")


def step_run_onnxruntime(folder: Path, k: int, n: int) -> dict:
    return _run(folder, k, "onnxruntime")


def step_run_onnxruntime_prepack(folder: Path, k: int, n: int) -> dict:
    return _run(folder, k, "onnxruntime", prepack=True)


def step_quantize_int4(folder: Path, k: int, n: int) -> dict:
    """Weight-only int4 block 32 of the mapped .eim, then the save: time and (by the caller)
    peak resident memory against the float32 weights."""
    import edgeinfer as ei

    model = ei.load(folder / "big.eim")
    weights = sum(a.nbytes for a in model.graph.initializers.values())
    before = _peak_mib()
    start = time.perf_counter()
    quantized = ei.quantize(model, weights="int4", mode="weight_only", block_size=32)
    quantized_s = time.perf_counter() - start
    quantized.save(folder / "big.int4.eim")
    return {"quantize_s": quantized_s, "quantize_and_save_s": time.perf_counter() - start,
            "weights_mib": weights / 2**20, "peak_before_mib": before}


def step_int4(folder: Path, k: int, n: int) -> dict:
    import edgeinfer as ei

    start = time.perf_counter()
    made = not (folder / "big.int4.eim").exists()  # quantize-int4 makes it, measured apart
    if made:
        ei.quantize(ei.load(folder / "big.eim"), weights="int4", block_size=32).save(folder / "big.int4.eim")
    took = time.perf_counter() - start
    ratio = (folder / "big.int4.eim").stat().st_size / (folder / "big.eim").stat().st_size
    # the matrix products themselves, one layer at a time, on random data: relative (Frobenius) error
    model = ei.load(folder / "big.eim")
    int4 = ei.load(folder / "big.int4.eim")
    errors = []
    rng = np.random.default_rng(2)
    first = next(n for n in int4.graph.nodes if n.op_type == "MatMulNBits")
    from edgeinfer.ir.contrib_ops import dequantize_rows

    w = model.graph.initializers["w0"]
    inits = int4.graph.initializers
    rows = slice(0, min(1024, first.attrs["N"]))
    deq = dequantize_rows(inits[first.inputs[1]], inits[first.inputs[2]], None, k=first.attrs["K"],
                          bits=4, block_size=32, rows=rows)
    x = rng.standard_normal((8, w.shape[0])).astype(np.float32)
    exact = x @ np.asarray(w[:, rows])
    errors.append(float(np.linalg.norm(x @ deq.T - exact) / np.linalg.norm(exact)))
    return {"quantize_and_save_s": took if made else None, "file_ratio": ratio, "matmul_relative_error": errors[0]}


def step_latency(folder: Path, k: int, n: int, runs: int = 10) -> dict:
    import edgeinfer as ei
    from edgeinfer.timing import time_engines

    feeds = _feeds(k)
    sessions = {"fp32": ei.Session(ei.load(folder / "big.eim"), backend="onnxruntime", threads=2),
                "int4": ei.Session(ei.load(folder / "big.int4.eim"), backend="onnxruntime", threads=2)}
    timings = time_engines({name: (lambda s=s: s.run(feeds)) for name, s in sessions.items()}, calls=runs)
    medians = {name: float(np.median(t)) * 1e3 for name, t in timings.items()}
    return {"fp32_ms": medians["fp32"], "int4_ms": medians["int4"], "int4_speedup": medians["fp32"] / medians["int4"]}


# -- int4 error on random data against the rate-distortion floor ----------------------------
CLIP_GRID = np.linspace(0.5, 1.0, 26)  # fractions of the block's range tried by the clip search


def _rtn(w: np.ndarray, block: int, zero_points: bool) -> np.ndarray:
    """[K, N] -> the [K, N] weight edgeinfer's int4 quantizer (round to nearest) gives back."""
    from edgeinfer.ir.contrib_ops import dequantize_rows
    from edgeinfer.quantize.weight_only import quantize_blocks

    b, scales, zps = quantize_blocks(w, bits=4, block_size=block, zero_points=zero_points)
    return dequantize_rows(b, scales, zps, k=w.shape[0], bits=4, block_size=block, rows=slice(None)).T


def _clip_search(w: np.ndarray, block: int, zero_points: bool) -> np.ndarray:
    """Round to nearest with each block's range shrunk by the factor in CLIP_GRID that
    minimises the block's squared error (an MSE-optimal scale per block, by search)."""
    k, n = w.shape
    blocks = w.T.reshape(n, k // block, block).astype(np.float32)
    best = np.full(blocks.shape[:2], np.inf, np.float32)
    out = np.zeros_like(blocks)
    if zero_points:
        low, high = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    else:
        extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    for factor in CLIP_GRID:
        if zero_points:
            scale = np.maximum((high - low) * factor / 15, 1e-30)
            zp = np.clip(np.rint(-low * factor / scale), 0, 15)
        else:
            scale = np.where(extreme == 0, 1e-30, extreme * factor / -8)
            zp = np.full(scale.shape, 8.0, np.float32)
        q = np.clip(np.rint(blocks / scale[..., None]) + zp[..., None], 0, 15)
        deq = (q - zp[..., None]) * scale[..., None]
        err = ((deq - blocks) ** 2).sum(-1)
        better = err < best
        best = np.where(better, err, best)
        out[better] = deq[better]
    return out.reshape(n, k).T


def step_int4_error(folder: Path, k: int, n: int) -> dict:
    """Relative (Frobenius) error of x @ W_int4 against x @ W on random W (Gaussian, uniform)
    and random x, for blocks 32/64/128 with and without zero points, round to nearest (the
    quantizer edgeinfer ships) and with a per-block clip search; next to the floor that rate
    distortion theory puts under any code of that many bits per weight (R: 4 bits plus the
    block's float32 scale and 4-bit zero point, as the .eim stores them): Gaussian D(R) =
    sigma^2 2^(-2R), a relative RMS error of 2^(-R); for uniform weights the Shannon lower bound,
    sqrt(12 / (2 pi e)) 2^(-R). A 2% error needs R >= 5.64 (Gaussian) or 5.39 (uniform)."""
    rng = np.random.default_rng(3)
    rows, cols = 4096, 512
    x = rng.standard_normal((64, rows)).astype(np.float32)
    sources = {"gaussian": rng.standard_normal((rows, cols)).astype(np.float32),
               "uniform": rng.uniform(-1, 1, (rows, cols)).astype(np.float32)}
    floor_factor = {"gaussian": 1.0, "uniform": float(np.sqrt(12 / (2 * np.pi * np.e)))}
    table = []
    for source, w in sources.items():
        exact = x @ w
        for block in (32, 64, 128):
            for zero_points in (False, True):
                rate = 4 + 32 / block + (4 / block if zero_points else 0)
                row = {"weights": source, "block": block, "zero_points": zero_points, "bits_per_weight": rate,
                       "floor": floor_factor[source] * 2.0 ** -rate}
                for method, quantize in (("rtn", _rtn), ("clip_search", _clip_search)):
                    deq = quantize(w, block, zero_points)
                    row[method] = float(np.linalg.norm(x @ deq - exact) / np.linalg.norm(exact))
                table.append(row)
    return {"int4_error": table, "weights_shape": [rows, cols]}


STEPS = {"make": step_make, "ort": step_ort, "convert": step_convert, "load": step_load, "hash": step_hash,
         "run-numpy": step_run_numpy, "run-onnxruntime": step_run_onnxruntime,
         "run-onnxruntime-prepack": step_run_onnxruntime_prepack, "quantize-int4": step_quantize_int4,
         "int4": step_int4,
         "latency": step_latency, "int4-error": step_int4_error}


EXTRA_STEPS = ("run-onnxruntime-prepack",)  # run with --only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the files")
    parser.add_argument("--only", nargs="*", choices=sorted(STEPS), help="run these steps (files must exist)")
    parser.add_argument("--step", choices=sorted(STEPS), help=argparse.SUPPRESS)  # one step, in this process
    args = parser.parse_args()
    if args.step:
        start = time.perf_counter()
        result = STEPS[args.step](args.dir, args.k, args.n)
        result.update(step=args.step, wall_s=time.perf_counter() - start, peak_rss_mib=_peak_mib())
        print(json.dumps(result))
        return
    folder = args.dir or Path(tempfile.mkdtemp(prefix="edgeinfer-big-"))
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for step in args.only or [name for name in STEPS if name not in EXTRA_STEPS]:
            done = subprocess.run([sys.executable, __file__, "--step", step, "--dir", os.fspath(folder),
                                   "--k", str(args.k), "--n", str(args.n)], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{step}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                break
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    by = {r["step"]: r for r in results}
    weights_mib = by.get("make", {}).get("weights_gib", 0) * 1024
    if "convert" in by and "ort" in by and weights_mib:
        c, o = by["convert"], by["ort"]
        print(f"convert+save: peak {c['peak_rss_mib']:.0f} MiB = {c['peak_rss_mib'] / weights_mib:.2f}x the weights "
              f"(target <= 1.5x); {c['convert_and_save_s']:.1f} s = {c['convert_and_save_s'] / o['load_s']:.2f}x "
              f"onnxruntime's load {o['load_s']:.1f} s (target <= 2x)")
    if "load" in by:
        print(f"load: {by['load']['load_s']:.3f} s, {by['load']['rss_after_load_mib']:.0f} MiB resident "
              f"(target < 0.5 s, < 512 MiB); the first load's imports took {by['load']['imports_s']:.2f} s more")
    for backend in ("numpy", "onnxruntime", "onnxruntime-prepack"):
        r = by.get(f"run-{backend}")
        if r and "ort" in by:
            routes = r.get("weights_by")
            via = (" (weights to onnxruntime: " + ", ".join(f"{v:.0f} MiB by {k}" for k, v in routes.items() if v)
                   + ")") if routes else ""
            print(f"run {backend}: peak {r['peak_rss_mib']:.0f} MiB vs onnxruntime's own {by['ort']['peak_rss_mib']:.0f}"
                  f" MiB (target <=); error {r['max_error_relative_to_max']:.2g} (target <= 1e-4){via}")
    if "hash" in by:
        r = by["hash"]
        print(f"content hash (auto's cache key): {r['hash_s']:.1f} s, peak {r['peak_rss_mib']:.0f} MiB "
              f"({r['peak_before_mib']:.0f} before), {r['rss_after_mib']:.0f} MiB resident after")
    if "quantize-int4" in by:
        r = by["quantize-int4"]
        print(f"quantize int4 block 32 + save: peak {r['peak_rss_mib']:.0f} MiB = {r['peak_rss_mib'] / r['weights_mib']:.2f}x "
              f"the {r['weights_mib']:.0f} MiB of float32 weights (target <= 1.5x; {r['peak_before_mib']:.0f} MiB "
              f"after imports and load); {r['quantize_s']:.1f} s to quantize, {r['quantize_and_save_s']:.1f} s with the save")
    if "int4" in by:
        print(f"int4 block 32: file {by['int4']['file_ratio']:.3f}x fp32 (target <= 0.16); matmul relative error "
              f"{by['int4']['matmul_relative_error']:.3%} (target <= 2%)")
    if "int4-error" in by:
        print("int4 matrix products on random data, relative error vs fp32 (target 2%), and the floor for any "
              "code of that many bits per weight:")
        print(f"  {'weights':<9} {'block':>5} {'zero pts':>8} {'bits/w':>6} {'nearest':>8} {'clip search':>11} "
              f"{'floor':>6}")
        for r in by["int4-error"]["int4_error"]:
            print(f"  {r['weights']:<9} {r['block']:>5} {'yes' if r['zero_points'] else 'no':>8} "
                  f"{r['bits_per_weight']:>6.3f} {r['rtn']:>8.2%} {r['clip_search']:>11.2%} {r['floor']:>6.2%}")
    if "latency" in by:
        r = by["latency"]
        print(f"onnxruntime batch 1: fp32 {r['fp32_ms']:.1f} ms, int4 {r['int4_ms']:.1f} ms = {r['int4_speedup']:.2f}x "
              "(target >= 1.5x)")


if __name__ == "__main__":
    main()
