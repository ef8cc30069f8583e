"""The numpy backend's neural-network kernels against ONNX's node test cases.

Every ONNX node test case whose graph uses only the ops of these kernels (Conv, pooling,
normalization, Gemm/MatMul/Einsum, Resize, Softmax, DepthToSpace, Q/DQ and the integer
ops) runs through the user's path, ``ei.Session(ei.convert(model), backend="numpy")``, and
is compared with the case's expected outputs: same dtype, fp32 within rtol 1e-5.
Randomized comparisons with onnxruntime live in ``test_nn_random.py``.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.backends.numpy.registry import KERNELS

NN_OPS = frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum", "MaxPool", "AveragePool", "LpPool",
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "BatchNormalization",
    "InstanceNormalization", "LayerNormalization", "GroupNormalization", "LpNormalization", "LRN",
    "MeanVarianceNormalization", "Resize", "Upsample", "Softmax", "LogSoftmax", "Hardmax",
    "DepthToSpace", "SpaceToDepth", "QuantizeLinear", "DequantizeLinear", "MatMulInteger",
    "ConvInteger", "QLinearMatMul", "QLinearConv",
})

# case name -> why it is skipped. Every reason starts with "BUG:" or "UNSUPPORTED:".
EXCLUDED: dict[str, str] = {
    "test_batchnorm_epsilon_training_mode": "UNSUPPORTED: training_mode=1 (inference backend; raises "
                                            "UnsupportedOpError, checked in test_batchnorm_training_mode_raises)",
    "test_batchnorm_example_training_mode": "UNSUPPORTED: training_mode=1 (see above)",
}


@functools.cache
def nn_cases() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return {case.name: case for case in cases
            if case.kind == "node" and {n.op_type for n in case.model.graph.node} <= NN_OPS}


def _case_names() -> list[str]:
    return sorted(nn_cases())


def _as_array(value, type_proto) -> np.ndarray:
    """Case data as a typed array: some cases store TensorProtos, and sub-byte / float8
    data as object arrays (the declared element type says what they hold)."""
    from onnx import TensorProto, helper, numpy_helper

    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    value = np.asarray(value)
    if value.dtype == object:
        return value.astype(helper.tensor_dtype_to_np_dtype(type_proto.tensor_type.elem_type))
    return value


# case name -> (rtol, atol), each with the reason it needs more than rtol 1e-5.
TOLERANCES: dict[str, tuple[float, float]] = {
    # The expected output is written out by hand with 4 significant digits.
    "test_averagepool_2d_ceil_last_window_starts_on_pad": (1e-3, 1e-4),
}


def _tolerance(case, expected: np.ndarray) -> dict:
    if case.name in TOLERANCES:
        rtol, atol = TOLERANCES[case.name]
        return {"rtol": rtol, "atol": atol}
    if expected.dtype in (np.float32, np.float64):
        # rtol 1e-5 unless the case was written with a stricter one; atol as the case says
        # (its generators compute expectations in float64 from float32 inputs).
        return {"rtol": min(1e-5, case.rtol), "atol": max(1e-6, case.atol) if case.atol else None}
    return {}


@pytest.mark.parametrize("name", _case_names())
def test_onnx_node_case(name: str) -> None:
    if name in EXCLUDED:
        pytest.skip(EXCLUDED[name])
    case = nn_cases()[name]
    model = ei.convert(case.model)
    session = ei.Session(model, backend="numpy")
    assert not session.stats().get("fallback_ops"), "an NN op fell back to onnx.reference"
    graph = case.model.graph
    inputs = [i for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    for feeds_list, expected_list in case.data_sets:
        feeds = {i.name: _as_array(v, i.type) for i, v in zip(inputs, feeds_list, strict=False)}
        got = session.run(feeds)
        for output, expected in zip(graph.output, expected_list, strict=True):
            expected = _as_array(expected, output.type)
            value = got[output.name]
            assert value.dtype == expected.dtype, f"{output.name}: dtype {value.dtype} != {expected.dtype}"
            assert_close(value, expected, name=output.name, **_tolerance(case, expected))


def test_cases_were_found() -> None:
    """Guard against a filter that silently selects nothing."""
    ops = {n.op_type for case in nn_cases().values() for n in case.model.graph.node}
    assert len(nn_cases()) > 200
    assert {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "Resize", "QLinearConv"} <= ops


@pytest.mark.parametrize("op", sorted(NN_OPS))
def test_every_nn_op_has_a_kernel_at_the_latest_opset(op: str) -> None:
    import onnx

    assert KERNELS.lookup(op, version=onnx.defs.onnx_opset_version()) is not None
