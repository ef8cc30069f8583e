"""Half-precision Softmax and the ONNX Attention cases built on it (fp16 and bf16).

ONNX defines Softmax by its function body (ReduceMax, Sub, Exp, ReduceSum, Div), every
intermediate a tensor of the input type; the numpy kernel rounds each step to that type and
accumulates the sum in float32. The oracle is ONNX's own reference evaluator: for float16 as
it is (numpy sums float16 in float32), for bfloat16 with its Softmax accumulating the sum in
float32 too (numpy sums bfloat16 one rounded addition at a time, which stalls once the sum is
256 times an element: a uniform softmax over 4096 keys would give 1/256 each).
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import edgeinfer as ei
from devkit.testing import assert_close, parse_model

HALF_ATTENTION = re.compile(r"test_attention_\w*_(fp16|bf16)_expanded")


class Float32SumSoftmax(OpRun):
    """ONNX's reference Softmax with the denominator accumulated in float32."""

    op_domain = ""

    def _run(self, x, axis=None):
        axis = -1 if axis is None else axis
        shifted = x - x.max(axis=axis, keepdims=True)
        exp = np.exp(shifted)
        total = exp.astype(np.float32).sum(axis=axis, keepdims=True).astype(x.dtype)
        return (exp / total,)


Float32SumSoftmax.__name__ = "Softmax"  # the reference evaluator looks implementations up by class name


@functools.cache
def attention_cases() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in collect_testcases() if HALF_ATTENTION.fullmatch(case.name)}


def _case_data(case):
    from onnx import TensorProto, numpy_helper

    names = [i.name for i in case.model.graph.input]
    outputs = [o.name for o in case.model.graph.output]
    for inputs, expected in case.data_sets:
        arrays = [numpy_helper.to_array(x) if isinstance(x, TensorProto) else x for x in inputs]
        yield dict(zip(names, arrays, strict=True)), dict(zip(outputs, expected, strict=True))


def _run_numpy(case, feeds) -> dict:
    with np.errstate(all="ignore"):
        return ei.Session(ei.convert(case.model), backend="numpy").run(feeds)


def test_the_causal_and_padded_variants_are_covered():
    names = attention_cases()
    assert any("causal" in n and "bf16" in n for n in names) and any("padded_kv" in n for n in names)
    assert any(n.endswith("fp16_expanded") for n in names)


@pytest.mark.parametrize("name", sorted(attention_cases()))
def test_attention_matches_the_reference_at_the_cases_tolerance(name):
    case = attention_cases()[name]
    reference = ReferenceEvaluator(case.model, new_ops=[Float32SumSoftmax])
    for feeds, _ in _case_data(case):
        got = _run_numpy(case, feeds)
        with np.errstate(all="ignore"):
            want = dict(zip(got, reference.run(list(got), feeds), strict=True))
        for output, expected in want.items():
            assert got[output].dtype == expected.dtype
            assert_close(got[output].astype(np.float32), expected.astype(np.float32), rtol=case.rtol,
                         atol=case.atol, name=output)


@pytest.mark.parametrize("name", sorted(n for n in attention_cases() if "fp16" in n))
def test_fp16_attention_matches_the_cases_expected_outputs(name):
    """float16: the reference itself sums in float32, so its expected outputs are matched."""
    case = attention_cases()[name]
    for feeds, expected in _case_data(case):
        got = _run_numpy(case, feeds)
        for output, want in expected.items():
            assert_close(got[output].astype(np.float32), np.asarray(want).astype(np.float32), rtol=case.rtol,
                         atol=case.atol, name=output)


def _softmax_model(op: str, dtype: str, axis: int, shape: tuple[int, ...] = (2, 3, 37)):
    dims = ", ".join(map(str, shape))
    return parse_model(f"""
        <ir_version: 9, opset_import: ["" : 21]>
        g ({dtype}[{dims}] x) => ({dtype}[{dims}] y)
        {{
            y = {op} <axis = {axis}> (x)
        }}""")


def _numpy_run(model, x: np.ndarray) -> np.ndarray:
    return ei.Session(ei.convert(model, optimize=0), backend="numpy").run({"x": x})["y"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_rounds_each_step_of_the_function_body(dtype, axis, rng):
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    model = _softmax_model("Softmax", dtype, axis)
    x = (rng.standard_normal((2, 3, 37)) * 4).astype(dtype)
    got = _numpy_run(model, x)
    want = ReferenceEvaluator(model, new_ops=[Float32SumSoftmax]).run(None, {"x": x})[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("axis", [-1, 0])
def test_fp16_log_softmax_follows_its_function_body(axis, rng):
    """The oracle is LogSoftmax's function body run by the reference evaluator (the reference's
    own LogSoftmax takes the log of a rounded softmax, which underflows to -inf)."""
    body = parse_model(f"""
        <ir_version: 9, opset_import: ["" : 21]>
        g (float16[2, 3, 37] x) => (float16[2, 3, 37] y)
        {{
            axes = Constant <value_ints = [{axis}]> ()
            peak = ReduceMax <keepdims = 1> (x, axes)
            shifted = Sub(x, peak)
            exp = Exp(shifted)
            total = ReduceSum <keepdims = 1> (exp, axes)
            log_total = Log(total)
            y = Sub(shifted, log_total)
        }}""")
    x = (rng.standard_normal((2, 3, 37)) * 4).astype(np.float16)
    got = _numpy_run(_softmax_model("LogSoftmax", "float16", axis), x)
    np.testing.assert_array_equal(got, ReferenceEvaluator(body).run(None, {"x": x})[0])


def test_bf16_softmax_over_a_long_row_sums_in_float32():
    import ml_dtypes

    keys = 4096
    got = _numpy_run(_softmax_model("Softmax", "bfloat16", -1, (1, keys)),
                     np.zeros((1, keys), dtype=ml_dtypes.bfloat16))
    assert_close(got.astype(np.float64), np.full((1, keys), 1.0 / keys))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_computes_as_its_standard_ops(dtype, masked, rng):
    """edgeinfer::Attention against the reference evaluator on the same math in standard ops
    (MatMul, Mul by the scale, Add of the mask, Softmax, MatMul): same dtype, same values."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    from edgeinfer.ir import Graph, Node, Value

    batch, seq, keys, heads, size = 2, 5, 7, 2, 4
    scale = 0.5
    text_type = {"float32": "float"}.get(dtype, dtype)  # as onnx.parser spells it
    mask_input = f", {text_type}[{seq}, {keys}] mask" if masked else ""
    reference = parse_model(f"""
        <ir_version: 9, opset_import: ["" : 21]>
        g ({text_type}[{batch}, {heads}, {seq}, {size}] q, {text_type}[{batch}, {heads}, {size}, {keys}] k,
           {text_type}[{batch}, {heads}, {keys}, {size}] v{mask_input})
          => ({text_type}[{batch}, {heads}, {seq}, {size}] y)
        {{
            scale_float = Constant <value = float[1] {{{scale}}}> ()
            s = CastLike(scale_float, q)
            scores = MatMul(q, k)
            scaled = Mul(scores, s)
            {"biased = Add(scaled, mask)" if masked else "biased = Identity(scaled)"}
            probs = Softmax <axis = -1> (biased)
            y = MatMul(probs, v)
        }}""")
    q, k, v = (rng.standard_normal((batch, n, heads * size)).astype(dtype) for n in (seq, keys, keys))
    mask = np.where(rng.random((seq, keys)) < 0.3, -np.inf, 0.0).astype(dtype)
    mask[:, 0] = 0  # no row fully masked
    inputs = [Value("q", dtype, q.shape), Value("k", dtype, k.shape), Value("v", dtype, v.shape)]
    inputs += [Value("mask", dtype, mask.shape)] if masked else []
    node = Node("Attention", [i.name for i in inputs], ["y"], {"num_heads": heads, "scale": scale},
                domain="edgeinfer")
    fused = ei.Model(Graph([node], inputs, [Value("y", dtype, (batch, seq, heads * size))], {},
                           opset={"": 21, "edgeinfer": 1}))
    feeds = {"q": q, "k": k, "v": v, **({"mask": mask} if masked else {})}
    got = ei.Session(fused, backend="numpy").run(feeds)["y"]

    def split(x):
        return x.reshape(batch, x.shape[1], heads, size).transpose(0, 2, 1, 3)

    reference_feeds = {"q": split(q), "k": split(k).transpose(0, 1, 3, 2), "v": split(v),
                       **({"mask": mask} if masked else {})}
    want = ReferenceEvaluator(reference, new_ops=[Float32SumSoftmax]).run(None, reference_feeds)[0]
    want = want.transpose(0, 2, 1, 3).reshape(batch, seq, heads * size)
    assert got.dtype == want.dtype == np.dtype(dtype)
    if dtype == "float32":  # BLAS and numpy's matmul sum in different orders
        assert_close(got, want)
    else:
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
