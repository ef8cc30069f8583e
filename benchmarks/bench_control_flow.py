"""Per-iteration cost of Loop and Scan on the numpy backend, against onnx.reference (the path a
Loop took before the native kernels: the whole loop in one fallback node) and onnxruntime.

The bodies are small (a 16-wide recurrent cell: MatMul, Add, Tanh, a reduction and a compare),
so the figure is mostly per-iteration overhead: preparing feeds, the step loop over the body,
collecting scan outputs. Timing is interleaved (``edgeinfer.timing.time_engines``: interleaved blocks);
the median of the rounds is reported, in microseconds per iteration. Usage::

    python benchmarks/bench_control_flow.py [--iterations 500] [--rounds 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

import edgeinfer as ei
from edgeinfer.timing import time_engines

WIDTH = 16

LOOP = """<ir_version: 8, opset_import: ["" : 17]>
agraph (float[{w}] x, int64 m) => (float[{w}] h, float[?,{w}] hs) {{
    c0 = Constant<value = bool {{1}}>()
    h, hs = Loop(m, c0, x) <body = step (int64 i, bool c, float[{w}] h_in) => (bool c_out, float[{w}] h_out, float[{w}] h_scan) {{
        mm = MatMul(h_in, W)
        a = Add(mm, bias)
        h_out = Tanh(a)
        s = ReduceSum<keepdims = 0>(h_out)
        lim = Constant<value = float {{1000000}}>()
        c_out = Less(s, lim)
        h_scan = Identity(h_out)
    }}>
}}
"""

SCAN = """<ir_version: 8, opset_import: ["" : 17]>
agraph (float[{w}] h0, float[?,{w}] xs) => (float[{w}] h, float[?,{w}] hs) {{
    h, hs = Scan<num_scan_inputs = 1, body = cell (float[{w}] h_in, float[{w}] x_t) => (float[{w}] h_out, float[{w}] y_t) {{
        mm = MatMul(h_in, W)
        a = Add(mm, x_t)
        h_out = Tanh(a)
        y_t = Identity(h_out)
    }}>(h0, xs)
}}
"""


def with_weights(text: str, names: tuple[str, ...]) -> onnx.ModelProto:
    """The model with the outer-scope initializers (W, bias) its body reads."""
    model = onnx.parser.parse_model(text.format(w=WIDTH))
    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / WIDTH,
               "bias": rng.standard_normal(WIDTH).astype(np.float32) * 0.1}
    model.graph.initializer.extend(numpy_helper.from_array(weights[name], name) for name in names)
    onnx.checker.check_model(model)
    return model


def contenders(model: onnx.ModelProto, feeds: dict, threads: int) -> dict:
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    session = ei.Session(ei.convert(model), backend="numpy", threads=threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    ort_session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    reference = ReferenceEvaluator(model)
    assert not session.stats().get("fallback_ops"), "the numpy backend must run the loop natively"
    return {"numpy": lambda: session.run(feeds), "onnx.reference": lambda: reference.run(None, feeds),
            "onnxruntime": lambda: ort_session.run(None, feeds)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(1)
    cases = {
        "Loop": (with_weights(LOOP, ("W", "bias")), {"x": rng.standard_normal(WIDTH).astype(np.float32),
                                      "m": np.array(args.iterations, np.int64)}),
        "Scan": (with_weights(SCAN, ("W",)), {"h0": np.zeros(WIDTH, np.float32),
                                      "xs": rng.standard_normal((args.iterations, WIDTH)).astype(np.float32)}),
    }
    print(f"{args.iterations} iterations, width {WIDTH}, {args.threads} thread(s), median of {args.rounds} rounds")
    print(f"{'op':6} {'numpy us/it':>12} {'onnx.reference':>15} {'onnxruntime':>12}")
    for op, (model, feeds) in cases.items():
        times = time_engines(contenders(model, feeds, args.threads), calls=args.rounds, warmup=1)
        per_iteration = {name: statistics.median(t) / args.iterations * 1e6 for name, t in times.items()}
        print(f"{op:6} {per_iteration['numpy']:12.1f} {per_iteration['onnx.reference']:15.1f} "
              f"{per_iteration['onnxruntime']:12.1f}")


if __name__ == "__main__":
    main()
