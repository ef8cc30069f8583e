"""Micro-benchmark: the numpy backend's Conv kernel against onnxruntime on ResNet-50 shapes
(and MobileNetV2's depthwise ones).

Both run at batch 1 with the same thread count (BLAS threads for numpy, intra-op threads for
onnxruntime). Each shape is timed as the median of ``--repeat`` runs after a warm-up, and
the two outputs are compared so a fast but wrong kernel cannot pass unnoticed. ``--resnet50``
also times a whole ResNet-50 (batch norm folded into the convolutions, random weights) built
in code, through ``ei.Session(..., backend="numpy", threads=N)`` and onnxruntime.

    .venv/bin/python benchmarks/bench_conv_kernels.py --threads 2 --repeat 20 --resnet50
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np

# (name, C_in, C_out, H=W, kernel, stride, pad, group)
SHAPES = [
    ("stem 7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3, 1),
    ("3x3 64 @56", 64, 64, 56, 3, 1, 1, 1),
    ("3x3 128 @28", 128, 128, 28, 3, 1, 1, 1),
    ("3x3/2 128 @56", 128, 128, 56, 3, 2, 1, 1),
    ("3x3 256 @14", 256, 256, 14, 3, 1, 1, 1),
    ("3x3 512 @7", 512, 512, 7, 3, 1, 1, 1),
    ("1x1 64->256 @56", 64, 256, 56, 1, 1, 0, 1),
    ("1x1 256->64 @56", 256, 64, 56, 1, 1, 0, 1),
    ("1x1 512->128 @28", 512, 128, 28, 1, 1, 0, 1),
    ("1x1 1024->256 @14", 1024, 256, 14, 1, 1, 0, 1),
    ("1x1/2 1024->2048 @14", 1024, 2048, 14, 1, 2, 0, 1),
    ("1x1 512->2048 @7", 512, 2048, 7, 1, 1, 0, 1),
    ("dw 3x3 32 @112", 32, 32, 112, 3, 1, 1, 32),
    # MobileNetV2's other depthwise shapes
    ("dw 3x3/2 96 @112", 96, 96, 112, 3, 2, 1, 96),
    ("dw 3x3 144 @56", 144, 144, 56, 3, 1, 1, 144),
    ("dw 3x3 384 @14", 384, 384, 14, 3, 1, 1, 384),
    ("dw 3x3 960 @7", 960, 960, 7, 3, 1, 1, 960),
]


def _median_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ort_session(c_in: int, c_out: int, kernel: int, stride: int, pad: int, group: int, weights, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[kernel, kernel],
                            strides=[stride, stride], pads=[pad] * 4, group=group)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights[0], "w"), numpy_helper.from_array(weights[1], "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def resnet50(rng: np.random.Generator):
    """ResNet-50 v1.5 for inference (BN folded into conv biases) as an ONNX model."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(x: str, c_in: int, c_out: int, k: int, stride: int, relu: bool) -> str:
        name = f"conv{len(nodes)}"
        w = rng.standard_normal((c_out, c_in, k, k)) * np.sqrt(2.0 / (c_in * k * k))
        b = rng.standard_normal(c_out) * 0.1
        nodes.append(helper.make_node("Conv", [x, const(name + "_w", w), const(name + "_b", b)], [name],
                                      kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4))
        if not relu:
            return name
        nodes.append(helper.make_node("Relu", [name], [name + "_relu"]))
        return name + "_relu"

    x = conv("input", 3, 64, 7, 2, True)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x, c_in = "pool", 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            y = conv(x, c_in, width, 1, 1, True)
            y = conv(y, width, width, 3, stride, True)
            y = conv(y, width, width * 4, 1, 1, False)
            shortcut = conv(x, c_in, width * 4, 1, stride, False) if block == 0 else x
            out = f"block{stage}_{block}"
            nodes.append(helper.make_node("Add", [y, shortcut], [out + "_sum"]))
            nodes.append(helper.make_node("Relu", [out + "_sum"], [out]))
            x, c_in = out, width * 4
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    fc_w = const("fc_w", rng.standard_normal((1000, 2048)) * 0.02)
    nodes.append(helper.make_node("Gemm", ["flat", fc_w, const("fc_b", np.zeros(1000))], ["logits"], transB=1))
    graph = helper.make_graph(nodes, "resnet50", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def bench_resnet50(threads: int, repeat: int) -> None:
    import onnxruntime as ort

    import edgeinfer as ei

    rng = np.random.default_rng(0)
    model = resnet50(rng)
    x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    session = ei.Session(ei.convert(model), backend="numpy", threads=threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    reference = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ours = session.run({"input": x})["logits"]
    theirs = reference.run(None, {"input": x})[0]
    err = float(np.abs(ours - theirs).max() / (np.abs(theirs).max() + 1e-12))
    t_numpy = _median_seconds(functools.partial(session.run, {"input": x}), repeat)
    t_ort = _median_seconds(functools.partial(reference.run, None, {"input": x}), repeat)
    print(f"{'ResNet-50 (whole model)':<24}{t_numpy * 1e3:>10.1f}{t_ort * 1e3:>10.1f}{t_numpy / t_ort:>8.2f}"
          f"  (max rel err {err:.1e}, fallback ops {session.stats().get('fallback_ops') or 'none'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--resnet50", action="store_true", help="also time a whole ResNet-50")
    args = parser.parse_args()

    from threadpoolctl import threadpool_limits

    from edgeinfer.backends.numpy.kernels.conv import conv

    rng = np.random.default_rng(0)
    total_numpy = total_ort = 0.0
    print(f"{'shape':<24}{'numpy ms':>10}{'ort ms':>10}{'ratio':>8}")
    with threadpool_limits(limits=args.threads, user_api="blas"):
        for name, c_in, c_out, size, k, stride, pad, group in SHAPES:
            x = rng.standard_normal((1, c_in, size, size), dtype=np.float32)
            w = (rng.standard_normal((c_out, c_in // group, k, k), dtype=np.float32) / np.sqrt(c_in * k * k / group)).astype(np.float32)
            b = rng.standard_normal(c_out, dtype=np.float32)
            attrs = dict(kernel_shape=(k, k), strides=(stride, stride), pads=(pad,) * 4, group=group)
            session = _ort_session(c_in, c_out, k, stride, pad, group, (w, b), args.threads)
            ours = conv(x, w, b, **attrs)
            theirs = session.run(None, {"x": x})[0]
            err = float(np.abs(ours - theirs).max() / (np.abs(theirs).max() + 1e-12))
            t_numpy = _median_seconds(functools.partial(conv, x, w, b, **attrs), args.repeat)
            t_ort = _median_seconds(functools.partial(session.run, None, {"x": x}), args.repeat)
            total_numpy += t_numpy
            total_ort += t_ort
            flag = "" if err < 1e-4 else f"  MISMATCH rel err {err:.2e}"
            print(f"{name:<24}{t_numpy * 1e3:>10.3f}{t_ort * 1e3:>10.3f}{t_numpy / t_ort:>8.2f}{flag}")
    print(f"{'total':<24}{total_numpy * 1e3:>10.3f}{total_ort * 1e3:>10.3f}{total_numpy / total_ort:>8.2f}")
    if args.resnet50:
        bench_resnet50(args.threads, max(3, args.repeat // 4))


if __name__ == "__main__":
    main()
