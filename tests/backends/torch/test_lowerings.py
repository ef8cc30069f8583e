"""Every torch lowering against the numpy backend, op by op, on torch's CPU device.

ONNX's node test cases (``test_torch_conformance.py``) run each op at the newest opset; the
graphs here cover what they do not: the older-opset forms (attribute axes, coerced softmax,
Upsample, Resize-10, Clip-6, ...), the ``edgeinfer`` domain's fused ops with every
activation, GlobalLpPool, and dtypes the cases skip. ``test_every_lowering_is_exercised``
checks that together they reach every registered ``(domain, op_type, since)``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.backends.numpy import KERNELS, NumpyBackend
from edgeinfer.backends.torch import LOWERINGS, TorchBackend
from edgeinfer.ir import dtypes

DEVICE = os.environ.get("EDGEINFER_TORCH_DEVICE", "cpu")  # gpu_check.sh: cuda:0
HEADER = '<ir_version: 8, opset_import: ["" : {opset}, "edgeinfer" : 1]>'

# id -> (opset, graph text). Inputs are random: floats standard normal, ints in [0, 4), bools.
CASES: dict[str, tuple[int, str]] = {
    "split_even": (11, "g (float[6,4] x) => (float[6,2] a, float[6,2] b) { a, b = Split <axis = 1> (x) }"),
    "upsample_attribute": (7, 'g (float[1,2,3,3] x) => (float[1,2,6,9] y) { y = Upsample <mode = "nearest", scales = [1.0, 1.0, 2.0, 3.0]> (x) }'),
    "upsample_input": (9, 'g (float[1,2,3,3] x) => (float[1,2,6,6] y) <float[4] s = {1.0, 1.0, 2.0, 2.0}> { y = Upsample <mode = "linear"> (x, s) }'),
    "resize_10": (10, 'g (float[1,2,3,4] x) => (float[1,2,6,8] y) <float[4] s = {1.0, 1.0, 2.0, 2.0}> { y = Resize <mode = "nearest"> (x, s) }'),
    "global_lp_pool": (17, "g (float[2,3,4,4] x) => (float[2,3,1,1] y) { y = GlobalLpPool <p = 3> (x) }"),
    "max_pool_asymmetric_indices": (17, "g (float[1,2,5,5] x) => (float[1,2,3,3] y, int64[1,2,3,3] i) { y, i = MaxPool <kernel_shape = [3, 3], pads = [0, 1, 2, 1], strides = [2, 2]> (x) }"),
    "average_pool_asymmetric": (17, "g (float[1,2,5,5] x) => (float[1,2,3,3] y) { y = AveragePool <kernel_shape = [3, 3], pads = [0, 1, 2, 1], strides = [2, 2]> (x) }"),
    "conv_asymmetric_pads": (17, "g (float[1,3,6,6] x, float[4,3,3,3] w) => (float[1,4,5,6] y) { y = Conv <pads = [0, 1, 1, 1]> (x, w) }"),
    "conv_transpose_output_padding": (17, "g (float[1,3,4,4] x, float[3,2,3,3] w, float[2] b) => (float[1,2,10,10] y) { y = ConvTranspose <strides = [2, 2], pads = [1, 1, 0, 0], output_padding = [1, 1]> (x, w, b) }"),
    "gather_negative": (17, "g (float[5,3] x) => (float[2,2,3] y) <int64[2,2] i = {-1, 0, 2, -5}> { y = Gather <axis = 0> (x, i) }"),
    "slice_negative_step": (17, "g (float[6,5] x) => (float[3,5] y) <int64[1] s = {-1}, int64[1] e = {-7}, int64[1] a = {0}, int64[1] t = {-2}> { y = Slice (x, s, e, a, t) }"),
    "pad_reflect": (17, 'g (float[2,5] x) => (float[2,9] y) <int64[4] p = {0, 2, 0, 2}> { y = Pad <mode = "reflect"> (x, p) }'),
    "shape_arithmetic": (17, """g (float[2,3,4] x) => (float[6,4] y) <int64[1] zero = {0}, int64[1] one = {1}, int64[1] minus = {-1}> {
        s = Shape (x)
        a = Gather <axis = 0> (s, zero)
        b = Gather <axis = 0> (s, one)
        ab = Mul (a, b)
        t = Concat <axis = 0> (ab, minus)
        y = Reshape (x, t)
    }"""),
    "shape_scalar_gather": (17, """g (float[2,3,4] x) => (float[2,12] y) <int64 zero = {0}, int64[1] minus = {-1}, int64[1] axis = {0}> {
        s = Shape (x)
        n = Gather <axis = 0> (s, zero)
        u = Unsqueeze (n, axis)
        t = Concat <axis = 0> (u, minus)
        y = Reshape (x, t)
    }"""),  # YOLOv8's head: a scalar index into a shape picks a 0-d value
    "shape_to_data": (17, """g (float[2,3] x) => (float[2,3] y) {
        s = Shape (x)
        f = Cast <to = 1> (s)
        d = ReduceSum <keepdims = 0> (f)
        y = Div (x, d)
    }"""),
    "integer_div_mod": (17, "g (int32[8] a, int32[8] b) => (int32[8] q, int32[8] r) <int32[8] n = {-7, 7, -8, 9, 3, -3, 0, 5}> { c = Add (b, n)\n q = Div (n, c)\n r = Mod (n, c) }"),
}

ACTIVATIONS = {"": "", "Relu": "", "Clip": ", activation_params = [-0.5, 0.5]",
               "LeakyRelu": ", activation_params = [0.1]", "Sigmoid": "", "Tanh": "",
               "HardSigmoid": ", activation_params = [0.2, 0.5]", "HardSwish": "", "Silu": "", "Gelu": "",
               "GeluTanh": ""}
for _name, _params in ACTIVATIONS.items():
    _act = f'activation = "{_name}"{_params}'
    CASES[f"fused_conv_{_name or 'none'}"] = (17, f"g (float[1,3,6,6] x, float[4,3,3,3] w, float[4] b) => (float[1,4,3,3] y) {{ y = edgeinfer.FusedConv <{_act}, pads = [1, 1, 1, 1], strides = [2, 2]> (x, w, b) }}")
    CASES[f"fused_gemm_{_name or 'none'}"] = (17, f"g (float[3,5] a, float[4,5] b, float[4] c) => (float[3,4] y) {{ y = edgeinfer.FusedGemm <{_act}, transB = 1, alpha = 0.5> (a, b, c) }}")
    CASES[f"fused_matmul_{_name or 'none'}"] = (17, f"g (float[2,3,5] a, float[5,4] b, float[4] c) => (float[2,3,4] y) {{ y = edgeinfer.FusedMatMul <{_act}> (a, b, c) }}")
CASES.update({
    "ei_gelu": (17, 'g (float[3,4] x) => (float[3,4] y) { y = edgeinfer.Gelu <approximate = "tanh"> (x) }'),
    "ei_layer_norm": (17, "g (float[2,3,4] x, float[4] s, float[4] b) => (float[2,3,4] y) { y = edgeinfer.LayerNormalization <epsilon = 1e-5> (x, s, b) }"),
    "ei_attention": (17, "g (float[2,5,8] q, float[2,6,8] k, float[2,6,8] v) => (float[2,5,8] y) { y = edgeinfer.Attention <num_heads = 2, scale = 0.5> (q, k, v) }"),
    "ei_attention_mask": (17, "g (float[2,5,8] q, float[2,6,8] k, float[2,6,8] v, float[2,1,5,6] m) => (float[2,5,8] y) { y = edgeinfer.Attention <num_heads = 2, scale = 0.5> (q, k, v, m) }"),
})


# Old-opset forms: ``ei.convert`` upgrades old opsets (onnx.version_converter), so these graphs
# are read as they are, as a saved model of that opset would be.
OLD_FORMS: dict[str, tuple[int, str]] = {
    "softmax_1": (11, "g (float[2,3,4] x) => (float[2,3,4] y) { y = Softmax <axis = 1> (x) }"),
    "log_softmax_1": (11, "g (float[2,3,4] x) => (float[2,3,4] y) { y = LogSoftmax <axis = 1> (x) }"),
    "clip_6": (6, "g (float[3,4] x) => (float[3,4] y) { y = Clip <min = -0.5, max = 0.5> (x) }"),
    "dropout_7": (7, "g (float[3,4] x) => (float[3,4] y) { y = Dropout <ratio = 0.3> (x) }"),
    "scatter_9": (9, "g (float[3,3] x, float[2,3] u) => (float[3,3] y) <int64[2,3] i = {1, 0, 2, 0, 2, 1}> { y = Scatter <axis = 0> (x, i, u) }"),
    "split_2": (11, "g (float[6,4] x) => (float[2,4] a, float[4,4] b) { a, b = Split <axis = 0, split = [2, 4]> (x) }"),
    "squeeze_1": (11, "g (float[2,1,4,1] x) => (float[2,4] y) { y = Squeeze <axes = [1, -1]> (x) }"),
    "unsqueeze_1": (11, "g (float[2,4] x) => (float[2,1,4,1] y) { y = Unsqueeze <axes = [1, 3]> (x) }"),
    "hardmax_coerced": (11, "g (float[2,3,4] x) => (float[2,3,4] y) { y = Hardmax <axis = 1> (x) }"),
    "reduce_attribute_axes": (11, "g (float[2,3,4] x) => (float[2,1,4] y) { y = ReduceMean <axes = [1]> (x) }"),
    "reduce_l2_attribute": (11, "g (float[2,3,4] x) => (float[2,4] y) { y = ReduceL2 <axes = [1], keepdims = 0> (x) }"),
    "reduce_log_sum_exp_attribute": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { y = ReduceLogSumExp <axes = [-1]> (x) }"),
    "reduce_prod_attribute": (11, "g (float[2,3,4] x) => (float[1,1,1] y) { y = ReduceProd (x) }"),
    "reduce_min_attribute": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { y = ReduceMin <axes = [2]> (x) }"),
    "reduce_max_attribute": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { y = ReduceMax <axes = [2]> (x) }"),
    "reduce_l1_attribute": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { y = ReduceL1 <axes = [2]> (x) }"),
    "reduce_log_sum_attribute": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { z = Abs (x)\n y = ReduceLogSum <axes = [2]> (z) }"),
    "reduce_sum_square_attribute": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { y = ReduceSumSquare <axes = [2]> (x) }"),
    "reduce_sum_attribute": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { y = ReduceSum <axes = [2]> (x) }"),
    "reduce_sum_1": (11, "g (float[2,3,4] x) => (float[2,3,1] y) { y = ReduceSum <axes = [2]> (x) }"),
    "group_norm_18": (18, "g (float[2,4,3,3] x, float[2] s, float[2] b) => (float[2,4,3,3] y) { y = GroupNormalization <num_groups = 2, epsilon = 1e-5> (x, s, b) }"),
}


def _model(case_id: str) -> ei.Model:
    if case_id in OLD_FORMS:
        from onnx import parser

        from edgeinfer.ir.infer import infer_types
        from edgeinfer.ir.onnx_io import graph_from_model

        opset, text = OLD_FORMS[case_id]
        graph = infer_types(graph_from_model(parser.parse_model(HEADER.format(opset=opset) + "\n" + text)))
        return ei.Model(graph)
    opset, text = CASES[case_id]
    return ei.convert(parse_model(HEADER.format(opset=opset) + "\n" + text), optimize=0)


def _weight_only_model(block_size: int = 32) -> ei.Model:
    """Gemm -> Relu quantized to com.microsoft::MatMulNBits (int4 blocks, K not a multiple of
    the block) by ``ei.quantize``; with ``block_size=16`` the 8-bit form."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    k, n = 200, 96  # large enough for the quantizer to take (a small weight stays float)
    weight = numpy_helper.from_array(rng.standard_normal((n, k)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
                               helper.make_node("Relu", ["h"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])], [weight, bias])
    model = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    weights = "int4" if block_size == 32 else "int8"
    return ei.quantize(model, weights=weights, mode="weight_only", block_size=block_size)


@pytest.mark.parametrize("block_size", [32, 16], ids=["int4", "int8"])
def test_matmul_nbits_matches_numpy(block_size: int):
    graph = _weight_only_model(block_size).graph
    assert any(node.op_type == "MatMulNBits" for node in graph.nodes)
    assert TorchBackend().unsupported(graph) == {}
    feeds = random_feeds(graph)
    got = TorchBackend(device=DEVICE).compile(graph).run(feeds)["y"]
    assert_close(got, NumpyBackend().compile(graph).run(feeds)["y"], rtol=1e-5, atol=1e-5)


def random_feeds(graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.inputs:
        dtype = dtypes.numpy_dtype(value.dtype)
        shape = tuple(value.shape)
        if dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[value.name] = rng.random(shape) < 0.5
        else:
            feeds[value.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("case_id", [*CASES, *OLD_FORMS])
def test_lowering_matches_numpy(case_id: str):
    graph = _model(case_id).graph
    assert TorchBackend().unsupported(graph) == {}
    feeds = random_feeds(graph)
    got = TorchBackend(device=DEVICE).compile(graph).run(feeds)
    expected = NumpyBackend().compile(graph).run(feeds)
    for name in graph.output_names:
        assert got[name].dtype == expected[name].dtype, name
        assert_close(got[name], expected[name], name=name)


def test_host_shape_arithmetic_stays_on_the_host():
    """Shape -> Gather -> Mul -> Concat runs on CPU tensors; only the Reshape is device work."""
    stats = TorchBackend().compile(_model("shape_arithmetic").graph).stats()
    assert stats["placements"] == {"host": 5, "device": 1}


def _exercised() -> set[tuple[str, str, int]]:
    """(domain, op, since) of every lowering reached by a case here or an accepted ONNX case."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).with_name("test_torch_conformance.py")
    spec = importlib.util.spec_from_file_location("torch_conformance", path)
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    graphs = [_model(c).graph for c in [*CASES, *OLD_FORMS]] + [_weight_only_model().graph]
    outcomes = module.outcomes()
    graphs += [ei.convert(case.model).graph for case in module.NUMPY.node_cases()
               if outcomes[case.name].declined is None and outcomes[case.name].error is None]
    reached = set()
    for graph in graphs:
        for node in graph.nodes:
            version = graph.opset.get(node.domain, 1)
            since = [v for v in LOWERINGS.since_versions(node.op_type, domain=node.domain) if v <= version]
            if since:
                reached.add((node.domain, node.op_type, since[-1]))
    return reached


def test_every_lowering_is_exercised():
    registered = {(d, op, v) for d, op in LOWERINGS.keys() for v in LOWERINGS.since_versions(op, domain=d)}
    missing = sorted(registered - _exercised())
    assert not missing, f"lowerings no test reaches: {missing}"


# The numpy kernels the torch backend does not lower, and why (the planner runs them elsewhere).
NOT_LOWERED = {
    **{("", op): "control flow: graph attributes" for op in ("If", "Loop", "Scan", "SequenceMap")},
    **{("", op): "sequences and optionals are Python lists / None, not tensors" for op in (
        "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement", "SequenceAt",
        "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
        "SplitToSequence")},
    ("edgeinfer", "CaffeDetectionOutput"): "per-image NMS with data-dependent output size",
    **{("edgeinfer", op): "TFLite's int8 fixed-point arithmetic (doubling high multiplies)" for op in (
        "TFLiteAdd", "TFLiteBatchMatMul", "TFLiteFullyConnected", "TFLiteMean", "TFLiteMul", "TFLiteRsqrt",
        "TFLiteSoftmax", "TFLiteSquaredDifference", "TFLiteSub")},
}


def test_lowerings_mirror_the_numpy_registry():
    """Every numpy kernel has a lowering at the same opset versions, or a reason above."""
    for key in KERNELS.keys():
        domain, op = key
        if key in NOT_LOWERED:
            assert key not in LOWERINGS
            continue
        assert LOWERINGS.since_versions(op, domain=domain) == KERNELS.since_versions(op, domain=domain), key
