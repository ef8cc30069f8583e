"""The numpy backend's general kernels against an independent oracle.

Each case is a small ONNX model (text syntax) run through ``ei.convert`` + ``ei.Session`` on the
numpy backend and compared with onnxruntime (or ``onnx.reference`` where onnxruntime lacks the
op, type or opset). Every case also checks that its ops ran on native kernels, not on the
``onnx.reference`` fallback, and that the output dtypes match the oracle's exactly. The cases
aim at what ONNX's own node tests miss: old-opset attribute forms, integer and half-precision
dtypes, negative indices and steps, ties, empty reductions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.parser
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.errors import BackendError

RNG = np.random.default_rng(1234)


def f32(*shape, low=-3.0, high=3.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


def ints(*shape, low=-20, high=20, dtype=np.int32):
    return RNG.integers(low, high, shape).astype(dtype)


def i64(*values):
    return np.array(values, dtype=np.int64)


@dataclass
class Case:
    id: str
    text: str  # graph text; the model header adds the opset
    feeds: dict[str, Any]
    opset: int = 13
    oracle: str = "ort"  # or "reference" (onnx.reference)
    upgrade: bool = True  # False: keep the model's opset, to test old-opset kernels
    tolerance: dict[str, float] = field(default_factory=dict)


def parse(case: Case) -> onnx.ModelProto:
    model = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {case.opset}]>\n{case.text}')
    for output in model.graph.output:  # the text gives output dtypes only
        output.type.tensor_type.ClearField("shape")
    return model


def declare_output_ranks(model: onnx.ModelProto, outputs: list[np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose outputs have the oracle's ranks, with symbolic dims (the ONNX
    checker wants every graph output to have a shape)."""
    declared = onnx.ModelProto()
    declared.CopyFrom(model)
    for index, (output, value) in enumerate(zip(declared.graph.output, outputs, strict=True)):
        shape = output.type.tensor_type.shape
        shape.SetInParent()
        for axis in range(np.ndim(value)):
            shape.dim.add().dim_param = f"out{index}_d{axis}"
    return declared


def oracle_outputs(case: Case, model: onnx.ModelProto) -> list[np.ndarray]:
    if case.oracle == "ort":
        import onnxruntime as ort

        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, case.feeds)
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, case.feeds)]


def run_numpy(case: Case, model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], dict]:
    """Outputs, and the fallback ops of every part the session split the graph into."""
    session = ei.Session(ei.convert(model, upgrade=case.upgrade), backend="numpy")
    outputs, stats = session.run(case.feeds), session.stats()
    return outputs, {op: n for part in stats.get("parts", [stats]) for op, n in part["fallback_ops"].items()}


def check(case: Case) -> None:
    bare = parse(case)
    expected = oracle_outputs(case, bare)
    model = declare_output_ranks(bare, expected)
    got, fallback = run_numpy(case, model)
    assert fallback == {}, f"ran on the onnx.reference fallback: {fallback}"
    for output, ref in zip(model.graph.output, expected, strict=True):
        ref = np.asarray(ref)
        value = got[output.name]
        assert isinstance(value, np.ndarray), f"{output.name}: got {type(value).__name__}, not an array"
        assert value.dtype == ref.dtype or (ref.dtype.kind in "OUS" and value.dtype == object), \
            f"{output.name}: dtype {value.dtype} != oracle's {ref.dtype}"
        assert_close(value, ref.astype(object) if ref.dtype.kind in "US" else ref, name=output.name,
                     **case.tolerance)


X34 = "(float[3,4] x) => (float y)"
CASES = [
    # -- arithmetic: dtype rules --------------------------------------------------------------
    Case("div_int32_truncates", "g (int32[6] a, int32[6] b) => (int32 y) { y = Div(a, b) }",
         {"a": np.array([7, -7, 7, -7, 0, -9], np.int32), "b": np.array([2, 2, -2, -2, 3, 4], np.int32)}),
    Case("div_int64_broadcast", "g (int64[3,1] a, int64[4] b) => (int64 y) { y = Div(a, b) }",
         {"a": ints(3, 1, dtype=np.int64), "b": np.array([3, -3, 5, -7], np.int64)}),
    Case("div_uint8", "g (uint8[5] a, uint8[5] b) => (uint8 y) { y = Div(a, b) }",
         {"a": np.array([255, 7, 0, 9, 200], np.uint8), "b": np.array([2, 7, 1, 4, 3], np.uint8)},
         oracle="reference"),  # onnxruntime has no uint8 Div
    Case("mod_int_sign_of_divisor", "g (int32[6] a, int32[6] b) => (int32 y) { y = Mod(a, b) }",
         {"a": np.array([7, -7, 7, -7, 0, 13], np.int32), "b": np.array([3, 3, -3, -3, 5, 4], np.int32)}),
    Case("mod_fmod_float", "g (float[6] a, float[6] b) => (float y) { y = Mod<fmod=1>(a, b) }",
         {"a": np.array([5.5, -5.5, 5.5, -5.5, 0.0, 3.0], np.float32),
          "b": np.array([2.0, 2.0, -2.0, -2.0, 1.5, 0.7], np.float32)}),
    Case("mod_fmod_int", "g (int64[4] a, int64[4] b) => (int64 y) { y = Mod<fmod=1>(a, b) }",
         {"a": i64(7, -7, 7, -7), "b": i64(3, 3, -3, -3)}),
    Case("pow_float_int_exponent", "g (float[3,4] a, int64[4] b) => (float y) { y = Pow(a, b) }",
         {"a": f32(3, 4), "b": i64(0, 1, 2, 3)}),
    Case("pow_int_float_exponent", "g (int32[4] a, float[4] b) => (int32 y) { y = Pow(a, b) }",
         {"a": np.array([2, 3, 4, 5], np.int32), "b": np.array([2.0, 0.5, 3.0, 1.5], np.float32)}),
    Case("pow_int64", "g (int64[4] a, int64[4] b) => (int64 y) { y = Pow(a, b) }",
         {"a": i64(2, -3, 4, 10), "b": i64(10, 3, 0, 12)}),
    Case("add_float16_broadcast", "g (float16[2,1,3] a, float16[4,1] b) => (float16 y) { y = Add(a, b) }",
         {"a": f32(2, 1, 3).astype(np.float16), "b": f32(4, 1).astype(np.float16)}),
    Case("sub_mul_int8_wrap", "g (int8[4] a, int8[4] b) => (int8 y, int8 z) { y = Sub(a, b)\n z = Mul(a, b) }",
         {"a": np.array([100, -100, 5, 127], np.int8), "b": np.array([-100, 100, 7, 2], np.int8)},
         oracle="reference"),  # onnxruntime has no int8 Sub/Mul
    Case("sum_mean_max_min_variadic",
         "g (float[3,1] a, float[4] b, float[1] c) => (float s, float m, float hi, float lo) {"
         " s = Sum(a, b, c)\n m = Mean(a, b, c)\n hi = Max(a, b, c)\n lo = Min(a, b, c) }",
         {"a": f32(3, 1), "b": f32(4), "c": f32(1)}),
    Case("max_int_single_input", "g (int32[5] a) => (int32 y) { y = Max(a) }", {"a": ints(5)}),
    Case("unary_math",
         f"g {X34.replace('float y', 'float a, float b, float c, float d, float e, float f')} {{"
         " a = Abs(x)\n b = Neg(x)\n c = Floor(x)\n d = Ceil(x)\n e = Sign(x)\n f = Exp(x) }",
         {"x": f32(3, 4)}),
    Case("round_half_to_even", "g (float[8] x) => (float y) { y = Round(x) }",
         {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6, -2.6], np.float32)}, opset=11),
    Case("trig", "g (float[10] x) => (float a, float b, float c, float d, float e, float f) {"
         " a = Sin(x)\n b = Cos(x)\n c = Tan(x)\n d = Atan(x)\n e = Sinh(x)\n f = Asinh(x) }",
         {"x": f32(10, low=-1.5, high=1.5)}),
    Case("inverse_trig", "g (float[10] x) => (float a, float b, float c, float d) {"
         " a = Asin(x)\n b = Acos(x)\n c = Atanh(x)\n d = Cosh(x) }", {"x": f32(10, low=-0.99, high=0.99)}),
    Case("log_sqrt_reciprocal", "g (float[10] x) => (float a, float b, float c, float d) {"
         " a = Log(x)\n b = Sqrt(x)\n c = Reciprocal(x)\n d = Acosh(x) }", {"x": f32(10, low=1.0, high=9.0)}),
    Case("erf_range", "g (float[200] x) => (float y) { y = Erf(x) }",
         {"x": np.concatenate([np.linspace(-6, 6, 190), [0, 1e-7, -1e-7, 0.4999, 0.5, 0.5001, 3e-3, 9, -9, 30]])
          .astype(np.float32)}),
    Case("isnan_isinf", "g (float[6] x) => (bool a, bool b, bool c, bool d) {"
         " a = IsNaN(x)\n b = IsInf(x)\n c = IsInf<detect_negative=0>(x)\n d = IsInf<detect_positive=0>(x) }",
         {"x": np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -2.0], np.float32)}),
    # -- comparisons, logic, bits ---------------------------------------------------------------
    Case("compare_broadcast", "g (int32[3,1] a, int32[4] b) => (bool e, bool l, bool le, bool g, bool ge) {"
         " e = Equal(a, b)\n l = Less(a, b)\n le = LessOrEqual(a, b)\n g = Greater(a, b)\n ge = GreaterOrEqual(a, b) }",
         {"a": ints(3, 1, low=-2, high=2), "b": ints(4, low=-2, high=2)}),
    Case("equal_strings", "g (string[4] a, string[4] b) => (bool y) { y = Equal(a, b) }",
         {"a": np.array(["a", "bc", "", "x"], dtype=object), "b": np.array(["a", "b", "", "y"], dtype=object)},
         opset=19, oracle="reference"),
    Case("bool_logic", "g (bool[2,3] a, bool[3] b) => (bool x, bool o, bool n, bool z) {"
         " x = And(a, b)\n o = Or(a, b)\n n = Not(a)\n z = Xor(a, b) }",
         {"a": RNG.random((2, 3)) > 0.5, "b": np.array([True, False, True])}),
    Case("bitwise", "g (int16[5] a, int16[5] b) => (int16 x, int16 o, int16 n, int16 z) {"
         " x = BitwiseAnd(a, b)\n o = BitwiseOr(a, b)\n n = BitwiseNot(a)\n z = BitwiseXor(a, b) }",
         {"a": ints(5, low=-300, high=300, dtype=np.int16), "b": ints(5, low=-300, high=300, dtype=np.int16)},
         opset=18),
    Case("bitshift_uint8", "g (uint8[5] a, uint8[5] b) => (uint8 l, uint8 r) {"
         " l = BitShift<direction=\"LEFT\">(a, b)\n r = BitShift<direction=\"RIGHT\">(a, b) }",
         {"a": np.array([1, 255, 16, 7, 128], np.uint8), "b": np.array([1, 1, 4, 0, 7], np.uint8)}, opset=11),
    Case("bitshift_uint32_wide_counts", "g (uint32[4] a, uint32[4] b) => (uint32 l, uint32 r) {"
         " l = BitShift<direction=\"LEFT\">(a, b)\n r = BitShift<direction=\"RIGHT\">(a, b) }",
         {"a": np.array([1, 3, 2**31, 12345], np.uint32), "b": np.array([31, 32, 40, 3], np.uint32)},
         opset=11, oracle="reference"),
    Case("where_broadcast", "g (bool[3,1] c, float[4] a, float[3,4] b) => (float y) { y = Where(c, a, b) }",
         {"c": np.array([[True], [False], [True]]), "a": f32(4), "b": f32(3, 4)}),
    Case("where_strings", "g (bool[3] c, string[3] a, string[3] b) => (string y) { y = Where(c, a, b) }",
         {"c": np.array([True, False, True]), "a": np.array(["a", "b", "c"], dtype=object),
          "b": np.array(["x", "y", "z"], dtype=object)}, opset=16),
    # -- activations -----------------------------------------------------------------------------
    Case("activations_basic", f"g {X34.replace('float y', 'float a, float b, float c, float d, float e, float f')} {{"
         " a = Relu(x)\n b = LeakyRelu<alpha=0.2>(x)\n c = Sigmoid(x)\n d = Tanh(x)\n e = Softsign(x)\n"
         " f = Softplus(x) }", {"x": f32(3, 4, low=-30, high=30)}),
    Case("activations_exp_family", f"g {X34.replace('float y', 'float a, float b, float c, float d, float e')} {{"
         " a = Elu<alpha=0.7>(x)\n b = Selu(x)\n c = Celu<alpha=1.5>(x)\n d = ThresholdedRelu<alpha=0.3>(x)\n"
         " e = HardSigmoid<alpha=0.3, beta=0.4>(x) }", {"x": f32(3, 4)}),
    Case("hardswish_mish", f"g {X34.replace('float y', 'float a, float b')} {{ a = HardSwish(x)\n b = Mish(x) }}",
         {"x": f32(3, 4, low=-8, high=8)}, opset=18),
    Case("gelu_exact_and_tanh", f"g {X34.replace('float y', 'float a, float b')} {{"
         " a = Gelu(x)\n b = Gelu<approximate=\"tanh\">(x) }", {"x": f32(3, 4, low=-6, high=6)}, opset=20),
    Case("prelu_broadcast_slope", "g (float[2,3,4] x, float[3,1] s) => (float y) { y = PRelu(x, s) }",
         {"x": f32(2, 3, 4), "s": f32(3, 1)}),
    Case("relu_int8", "g (int8[5] x) => (int8 y) { y = Relu(x) }",
         {"x": np.array([-128, -1, 0, 1, 127], np.int8)}, opset=14),
    Case("sigmoid_float16", "g (float16[6] x) => (float16 y) { y = Sigmoid(x) }",
         {"x": np.array([-20, -3, -0.5, 0, 2, 15], np.float16)}, tolerance={"rtol": 1e-3, "atol": 1e-4}),
    Case("clip_inputs", "g (float[3,4] x, float lo, float hi) => (float y, float z) {"
         " y = Clip(x, lo, hi)\n z = Clip(x, , hi) }",
         {"x": f32(3, 4), "lo": np.array(-1.0, np.float32), "hi": np.array(0.5, np.float32)}),
    Case("clip_min_above_max", "g (float[3,4] x, float lo, float hi) => (float y) { y = Clip(x, lo, hi) }",
         {"x": f32(3, 4), "lo": np.array(1.0, np.float32), "hi": np.array(-1.0, np.float32)}, oracle="reference"),
    Case("clip_int32", "g (int32[6] x, int32 lo) => (int32 y) { y = Clip(x, lo) }",
         {"x": ints(6), "lo": np.array(-3, np.int32)}),
    Case("clip_attributes_opset10", "g (float[3,4] x) => (float y, float z) {"
         " y = Clip<min=-0.5, max=0.7>(x)\n z = Clip<max=0.1>(x) }", {"x": f32(3, 4)}, opset=10, upgrade=False),
    # -- shape ops ---------------------------------------------------------------------------------
    Case("reshape_zero_and_minus_one", "g (float[2,3,4] x, int64[3] s) => (float y) { y = Reshape(x, s) }",
         {"x": f32(2, 3, 4), "s": i64(0, -1, 2)}),
    Case("reshape_allowzero", "g (float[0,3] x, int64[2] s) => (float y) { y = Reshape<allowzero=1>(x, s) }",
         {"x": np.zeros((0, 3), np.float32), "s": i64(3, 0)}, opset=14),
    Case("transpose_default_and_perm", "g (float[2,3,4] x) => (float a, float b) {"
         " a = Transpose(x)\n b = Transpose<perm=[1,2,0]>(x) }", {"x": f32(2, 3, 4)}),
    Case("squeeze_unsqueeze_inputs", "g (float[1,3,1,2] x, int64[2] ax, int64[2] ux) => (float a, float b, float c) {"
         " a = Squeeze(x, ax)\n b = Squeeze(x)\n c = Unsqueeze(x, ux) }",
         {"x": f32(1, 3, 1, 2), "ax": i64(0, -2), "ux": i64(-1, 1)}),
    Case("squeeze_unsqueeze_attributes_opset11", "g (float[1,3,1,2] x) => (float a, float c) {"
         " a = Squeeze<axes=[0,-2]>(x)\n c = Unsqueeze<axes=[-1,1]>(x) }", {"x": f32(1, 3, 1, 2)},
         opset=11, upgrade=False),
    Case("flatten_axes", "g (float[2,3,4,5] x) => (float a, float b, float c) {"
         " a = Flatten(x)\n b = Flatten<axis=0>(x)\n c = Flatten<axis=-1>(x) }", {"x": f32(2, 3, 4, 5)}),
    Case("expand_bidirectional", "g (float[3,1] x, int64[3] s) => (float y) { y = Expand(x, s) }",
         {"x": f32(3, 1), "s": i64(2, 1, 4)}),
    Case("shape_start_end_size", "g (float[2,3,4,5] x) => (int64 a, int64 b, int64 c, int64 n) {"
         " a = Shape(x)\n b = Shape<start=1, end=-1>(x)\n c = Shape<start=-10, end=10>(x)\n n = Size(x) }",
         {"x": f32(2, 3, 4, 5)}, opset=15),
    # -- tensor ops --------------------------------------------------------------------------------
    Case("concat_negative_axis", "g (float[2,3] a, float[2,1] b, float[2,0] c) => (float y) {"
         " y = Concat<axis=-1>(a, b, c) }", {"a": f32(2, 3), "b": f32(2, 1), "c": np.zeros((2, 0), np.float32)}),
    Case("concat_strings", "g (string[2] a, string[1] b) => (string y) { y = Concat<axis=0>(a, b) }",
         {"a": np.array(["p", "q"], dtype=object), "b": np.array(["r"], dtype=object)}),
    Case("split_input_sizes", "g (float[7,2] x, int64[3] s) => (float a, float b, float c) {"
         " a, b, c = Split<axis=0>(x, s) }", {"x": f32(7, 2), "s": i64(2, 0, 5)}),
    Case("split_equal", "g (float[2,6] x) => (float a, float b, float c) { a, b, c = Split<axis=-1>(x) }",
         {"x": f32(2, 6)}),
    Case("split_num_outputs_uneven", "g (float[7,2] x) => (float a, float b, float c) {"
         " a, b, c = Split<axis=0, num_outputs=3>(x) }", {"x": f32(7, 2)}, opset=18),
    Case("split_attribute_opset11", "g (float[7,2] x) => (float a, float b) { a, b = Split<axis=0, split=[3,4]>(x) }",
         {"x": f32(7, 2)}, opset=11, upgrade=False),
    Case("slice_negative_steps_and_clamping", "g (float[5,6] x, int64[2] st, int64[2] en, int64[2] ax, int64[2] sp)"
         " => (float y) { y = Slice(x, st, en, ax, sp) }",
         {"x": f32(5, 6), "st": i64(-1, 100), "en": i64(-2**63, 1), "ax": i64(0, -1), "sp": i64(-2, -3)}),
    Case("slice_defaults", "g (float[5,6] x, int64[1] st, int64[1] en) => (float y) { y = Slice(x, st, en) }",
         {"x": f32(5, 6), "st": i64(1), "en": i64(2**62)}),
    Case("tile", "g (int32[2,3] x, int64[2] r) => (int32 y) { y = Tile(x, r) }", {"x": ints(2, 3), "r": i64(3, 2)}),
    Case("pad_modes", "g (float[3,4] x, int64[4] p) => (float c, float r, float e) {"
         " c = Pad<mode=\"constant\">(x, p)\n r = Pad<mode=\"reflect\">(x, p)\n e = Pad<mode=\"edge\">(x, p) }",
         {"x": f32(3, 4), "p": i64(1, 2, 2, 1)}),
    Case("pad_constant_value_negative_pads", "g (int32[4,5] x, int64[4] p, int32 v) => (int32 y) {"
         " y = Pad(x, p, v) }", {"x": ints(4, 5), "p": i64(-1, 2, 1, -2), "v": np.array(9, np.int32)}),
    Case("pad_wrap_axes", "g (float[3,4,2] x, int64[4] p, float v, int64[2] ax) => (float w, float c) {"
         " w = Pad<mode=\"wrap\">(x, p, , ax)\n c = Pad(x, p, v, ax) }",
         {"x": f32(3, 4, 2), "p": i64(1, 2, 3, 1), "v": np.array(-5, np.float32), "ax": i64(0, -2)}, opset=19),
    Case("trilu", "g (float[2,4,5] x, int64 k) => (float u, float l) {"
         " u = Trilu(x, k)\n l = Trilu<upper=0>(x, k) }", {"x": f32(2, 4, 5), "k": np.array(-1, np.int64)}, opset=14),
    Case("compress", "g (float[3,4] x, bool[3] c, bool[5] f) => (float a, float b) {"
         " a = Compress<axis=0>(x, c)\n b = Compress(x, f) }",
         {"x": f32(3, 4), "c": np.array([True, False, True]), "f": np.array([0, 1, 1, 0, 1], bool)}, opset=11),
    Case("nonzero", "g (float[3,4] x) => (int64 y) { y = NonZero(x) }",
         {"x": np.where(f32(3, 4) > 0, 1.0, 0.0).astype(np.float32)}),
    Case("reverse_sequence_batch_first", "g (float[3,4,2] x, int64[3] l) => (float y) {"
         " y = ReverseSequence<batch_axis=0, time_axis=1>(x, l) }", {"x": f32(3, 4, 2), "l": i64(4, 1, 2)}, opset=10),
    Case("reverse_sequence_time_first", "g (float[4,3] x, int64[3] l) => (float y) {"
         " y = ReverseSequence<batch_axis=1, time_axis=0>(x, l) }", {"x": f32(4, 3), "l": i64(3, 0, 4)}, opset=10),
    Case("dropout_inference_with_mask", "g (float[3,4] x) => (float y, bool m) { y, m = Dropout(x) }",
         {"x": f32(3, 4)}),
    # -- casts --------------------------------------------------------------------------------------
    Case("cast_float_to_ints_truncates", "g (float[6] x) => (int32 a, uint8 b, int64 c, bool d) {"
         " a = Cast<to=6>(x)\n b = Cast<to=2>(x)\n c = Cast<to=7>(x)\n d = Cast<to=9>(x) }",
         {"x": np.array([2.7, -2.7, 0.0, 255.9, 1e-3, 100.5], np.float32)}),
    Case("cast_between_floats", "g (double[4] x) => (float16 a, float b) { a = Cast<to=10>(x)\n b = Cast<to=1>(x) }",
         {"x": np.array([1 / 3, 65504.0, 1e-8, -2.5], np.float64)}),
    Case("cast_to_from_string", "g (float[4] x, string[4] s) => (string a, float b) {"
         " a = Cast<to=8>(x)\n b = Cast<to=1>(s) }",
         {"x": np.array([1.5, -2.0, 0.25, 100.0], np.float32), "s": np.array(["1.5", "-3", "1e3", "inf"], dtype=object)},
         oracle="reference"),
    Case("cast_float8_saturate", "g (float[6] x) => (float8e4m3fn a, float8e5m2 b) {"
         " a = Cast<to=17>(x)\n b = Cast<to=19>(x) }",
         {"x": np.array([0.3, 500.0, -1e6, np.inf, 1e-4, 57344.0 * 2], np.float32)}, opset=19, oracle="reference"),
    Case("cast_float8_no_saturate", "g (float[4] x) => (float8e4m3fn a) { a = Cast<to=17, saturate=0>(x) }",
         {"x": np.array([0.3, 500.0, -1e6, 2.0], np.float32)}, opset=19, oracle="reference"),
    Case("castlike", "g (float[4] x, int8[1] t) => (int8 y) { y = CastLike(x, t) }",
         {"x": np.array([1.9, -1.9, 100.2, 0.0], np.float32), "t": np.zeros(1, np.int8)}, opset=15),
    # -- generators ----------------------------------------------------------------------------------
    Case("constant_forms", "g (float[1] x) => (float a, float b, int64 c, int64 d, float e) {"
         " a = Constant<value_float=2.5>()\n b = Constant<value_floats=[1.0, 2.0]>()\n"
         " c = Constant<value_int=7>()\n d = Constant<value_ints=[1, -2, 3]>()\n"
         " e = Constant<value=float[2] {4.0, 5.0}>() }", {"x": f32(1)}, opset=13),
    Case("constant_of_shape", "g (int64[2] s) => (float a) { a = ConstantOfShape(s) }", {"s": i64(2, 3)}),
    Case("constant_of_shape_int_value", "g (int64[3] s) => (int32 a) {"
         " a = ConstantOfShape<value=int32[1] {7}>(s) }", {"s": i64(2, 0, 3)}),
    Case("range_int_and_float", "g (int32 a, int32 b, int32 c, float d, float e, float f) => (int32 r, float q) {"
         " r = Range(a, b, c)\n q = Range(d, e, f) }",
         {"a": np.array(10, np.int32), "b": np.array(-3, np.int32), "c": np.array(-4, np.int32),
          "d": np.array(0.5, np.float32), "e": np.array(2.0, np.float32), "f": np.array(0.3, np.float32)}, opset=11),
    Case("range_empty", "g (int64 a, int64 b, int64 c) => (int64 r) { r = Range(a, b, c) }",
         {"a": np.array(5, np.int64), "b": np.array(1, np.int64), "c": np.array(2, np.int64)}, opset=11),
    Case("eyelike", "g (float[3,5] x) => (float a, int32 b) { a = EyeLike<k=1>(x)\n b = EyeLike<k=-2, dtype=6>(x) }",
         {"x": f32(3, 5)}, opset=9),
    Case("onehot_negative_indices_axis", "g (int64[2,3] i, int64 d, float[2] v) => (float a, float b) {"
         " a = OneHot<axis=1>(i, d, v)\n b = OneHot(i, d, v) }",
         {"i": np.array([[0, -1, 4], [2, 9, -5]], np.int64), "d": np.array(5, np.int64),
          "v": np.array([-1.0, 3.0], np.float32)}, opset=11),
    # -- indexing ------------------------------------------------------------------------------------
    Case("gather_negative_indices", "g (float[5,3] x, int64[2,2] i) => (float a, float b) {"
         " a = Gather<axis=0>(x, i)\n b = Gather<axis=-1>(x, i) }",
         {"x": f32(5, 3), "i": np.array([[0, -1], [2, -3]], np.int64)}),
    Case("gather_scalar_index", "g (float[5,3] x, int32 i) => (float a) { a = Gather<axis=1>(x, i) }",
         {"x": f32(5, 3), "i": np.array(-1, np.int32)}),
    Case("gather_elements", "g (float[3,4] x, int64[2,4] i) => (float y) { y = GatherElements<axis=0>(x, i) }",
         {"x": f32(3, 4), "i": np.array([[0, -1, 2, 1], [1, 0, -3, 2]], np.int64)}),
    Case("gather_nd_batch_dims", "g (float[2,3,4] x, int64[2,5,1] i) => (float y) { y = GatherND<batch_dims=1>(x, i) }",
         {"x": f32(2, 3, 4), "i": RNG.integers(-3, 3, (2, 5, 1)).astype(np.int64)}),
    Case("gather_nd_full_index", "g (float[2,3,4] x, int64[4,3] i) => (float y) { y = GatherND(x, i) }",
         {"x": f32(2, 3, 4), "i": np.array([[0, 1, 2], [1, -1, -1], [0, 0, 0], [-2, 2, 3]], np.int64)}),
    Case("scatter_elements_reductions", "g (float[3,4] x, int64[2,4] i, float[2,4] u) => (float n, float a, float m) {"
         " n = ScatterElements<axis=0>(x, i, u)\n a = ScatterElements<axis=0, reduction=\"add\">(x, i, u)\n"
         " m = ScatterElements<axis=0, reduction=\"max\">(x, i, u) }",
         {"x": f32(3, 4), "i": np.array([[0, 1, 2, -1], [1, 0, -3, 1]], np.int64), "u": f32(2, 4)}, opset=18),
    Case("scatter_elements_duplicates_add", "g (float[5] x, int64[6] i, float[6] u) => (float a, float m) {"
         " a = ScatterElements<reduction=\"add\">(x, i, u)\n m = ScatterElements<reduction=\"mul\">(x, i, u) }",
         {"x": f32(5), "i": np.array([0, 0, 3, -2, 1, 0], np.int64), "u": f32(6)}, opset=16),
    Case("scatter_nd_reductions", "g (float[4,3] x, int64[3,1] i, float[3,3] u) => (float n, float a, float lo) {"
         " n = ScatterND(x, i, u)\n a = ScatterND<reduction=\"add\">(x, i, u)\n"
         " lo = ScatterND<reduction=\"min\">(x, i, u) }",
         {"x": f32(4, 3), "i": np.array([[1], [-1], [0]], np.int64), "u": f32(3, 3)}, opset=18),
    Case("scatter_nd_duplicates_mul", "g (float[4,3] x, int64[3,2] i, float[3] u) => (float m) {"
         " m = ScatterND<reduction=\"mul\">(x, i, u) }",
         {"x": f32(4, 3), "i": np.array([[1, 2], [1, 2], [3, 0]], np.int64), "u": f32(3)}, opset=16),
    Case("topk_ties_largest", "g (float[2,6] x, int64[1] k) => (float v, int64 i) { v, i = TopK<axis=1>(x, k) }",
         {"x": np.array([[1, 3, 3, 2, 3, 0], [5, 5, 5, 5, 5, 5]], np.float32), "k": i64(4)}, opset=11),
    Case("topk_ties_smallest_axis0", "g (int32[5,2] x, int64[1] k) => (int32 v, int64 i) {"
         " v, i = TopK<axis=0, largest=0>(x, k) }",
         {"x": np.array([[2, 1], [1, 1], [2, 0], [1, 1], [0, 7]], np.int32), "k": i64(3)}, opset=11),
    Case("topk_uint8_extremes", "g (uint8[6] x, int64[1] k) => (uint8 v, int64 i) { v, i = TopK(x, k) }",
         {"x": np.array([0, 255, 3, 255, 0, 1], np.uint8), "k": i64(6)}, opset=11, oracle="reference"),
    # -- reductions ----------------------------------------------------------------------------------
    Case("argmax_argmin_select_last", "g (float[3,4] x) => (int64 a, int64 b, int64 c, int64 d) {"
         " a = ArgMax<axis=1>(x)\n b = ArgMax<axis=1, select_last_index=1>(x)\n"
         " c = ArgMin<axis=0, keepdims=0>(x)\n d = ArgMin<axis=-1, keepdims=0, select_last_index=1>(x) }",
         {"x": np.array([[1, 3, 3, 0], [2, 2, 1, 1], [0, 0, 0, 0]], np.float32)}),
    Case("cumsum_modes", "g (float[3,4] x, int32 ax) => (float a, float b, float c, float d) {"
         " a = CumSum(x, ax)\n b = CumSum<exclusive=1>(x, ax)\n c = CumSum<reverse=1>(x, ax)\n"
         " d = CumSum<exclusive=1, reverse=1>(x, ax) }", {"x": f32(3, 4), "ax": np.array(-1, np.int32)}),
    Case("cumsum_int32_keeps_dtype", "g (int32[5] x, int64 ax) => (int32 a) { a = CumSum(x, ax) }",
         {"x": ints(5), "ax": np.array(0, np.int64)}),
    Case("reduce_all_axes_input_form", "g (float[2,3,4] x, int64[2] ax) => (float s, float m, float hi, float lo,"
         " float p, float l1, float l2, float ls, float lse, float ss) {"
         " s = ReduceSum(x, ax)\n m = ReduceMean(x, ax)\n hi = ReduceMax(x, ax)\n lo = ReduceMin(x, ax)\n"
         " p = ReduceProd(x, ax)\n l1 = ReduceL1(x, ax)\n l2 = ReduceL2(x, ax)\n ls = ReduceLogSum(x, ax)\n"
         " lse = ReduceLogSumExp(x, ax)\n ss = ReduceSumSquare(x, ax) }",
         {"x": f32(2, 3, 4, low=0.1, high=2.0), "ax": i64(0, -1)}, opset=18),
    Case("reduce_attribute_form_opset11", "g (float[2,3,4] x) => (float s, float m, float hi, float lse, float l2) {"
         " s = ReduceSum<axes=[1], keepdims=0>(x)\n m = ReduceMean<axes=[-1,0]>(x)\n hi = ReduceMax(x)\n"
         " lse = ReduceLogSumExp<axes=[2]>(x)\n l2 = ReduceL2<axes=[0], keepdims=0>(x) }",
         {"x": f32(2, 3, 4)}, opset=11, upgrade=False),
    Case("reduce_noop_and_default_axes", "g (float[2,3] x, int64[0] e) => (float a, float b, float c) {"
         " a = ReduceSum<noop_with_empty_axes=1>(x, e)\n b = ReduceSum(x, e)\n c = ReduceMax<keepdims=0>(x) }",
         {"x": f32(2, 3), "e": np.zeros(0, np.int64)}, opset=18),
    Case("reduce_int32_keeps_dtype", "g (int32[3,4] x, int64[1] ax) => (int32 s, int32 p, int32 hi, int32 m) {"
         " s = ReduceSum(x, ax)\n p = ReduceProd(x, ax)\n hi = ReduceMax(x, ax)\n m = ReduceMean(x, ax) }",
         {"x": ints(3, 4, low=-5, high=5), "ax": i64(1)}, opset=18),
    Case("reduce_empty_set", "g (float[2,0,3] x, int64[1] ax) => (float s, float p, float hi, float lse) {"
         " s = ReduceSum(x, ax)\n p = ReduceProd(x, ax)\n hi = ReduceMax(x, ax)\n lse = ReduceLogSumExp(x, ax) }",
         {"x": np.zeros((2, 0, 3), np.float32), "ax": i64(1)}, opset=18, oracle="reference"),
    Case("reduce_logsumexp_large_values", "g (float[2,3] x, int64[1] ax) => (float y) { y = ReduceLogSumExp(x, ax) }",
         {"x": np.array([[1000, 1000, -1000], [-np.inf, 3, 2]], np.float32), "ax": i64(1)}, opset=18),
    Case("reduce_float16", "g (float16[4,64] x, int64[1] ax) => (float16 s, float16 m) {"
         " s = ReduceSum(x, ax)\n m = ReduceMean(x, ax) }", {"x": f32(4, 64).astype(np.float16), "ax": i64(1)},
         opset=18, tolerance={"rtol": 2e-3, "atol": 2e-3}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_matches_oracle(case: Case):
    check(case)


GENERAL_MODULES = tuple(f"edgeinfer.backends.numpy.kernels.{name}" for name in (
    "elementwise", "activations", "logic", "tensor", "shape", "reduce", "indexing", "generators"))


def test_general_kernels_register_true_since_versions():
    """Every ``since`` is a version at which the op's schema actually changed, so a model's
    opset resolves to the kernel written for that version of the spec."""
    from edgeinfer.backends.numpy.registry import KERNELS

    checked = 0
    for domain, op_type in KERNELS.keys():
        for since in KERNELS.since_versions(op_type, domain=domain):
            fn = KERNELS.lookup(op_type, domain=domain, version=since)
            if fn.__module__ not in GENERAL_MODULES:
                continue
            schema = onnx.defs.get_schema(op_type, since, domain)
            assert schema.since_version == since, f"{op_type}: registered since {since}, schema since " \
                                                  f"{schema.since_version}"
            checked += 1
    assert checked >= 100


@pytest.mark.parametrize("text, feeds, opset, match", [
    ("g (float[2,3] x, int64[2] s) => (float y) { y = Reshape(x, s) }",
     {"x": np.zeros((2, 3), np.float32), "s": i64(-1, -1)}, 13, r"more than one -1"),
    ("g (float[6] x, int64[2] s) => (float a, float b) { a, b = Split(x, s) }",
     {"x": np.zeros(6, np.float32), "s": i64(2, 3)}, 13, r"split sizes \[2, 3\] must be 2 non-negative sizes "
                                                         r"summing to dim 0 of size 6"),
    ("g (float[5] x, int64[1] k) => (float v, int64 i) { v, i = TopK(x, k) }",
     {"x": np.zeros(5, np.float32), "k": i64(6)}, 11, r"k=6 is out of range for an axis of size 5"),
    ("g (float[5] x, int64[1] s, int64[1] e, int64[1] a, int64[1] p) => (float y) { y = Slice(x, s, e, a, p) }",
     {"x": np.zeros(5, np.float32), "s": i64(0), "e": i64(5), "a": i64(0), "p": i64(0)}, 13, r"steps must be non-zero"),
    ("g (float[2,3] x, int64[1] a) => (float y) { y = Squeeze(x, a) }",
     {"x": np.zeros((2, 3), np.float32), "a": i64(1)}, 13, r"cannot squeeze axes \[1\] of shape \[2, 3\]"),
    ("g (float[2,3] x, int64[1] a) => (float y) { y = ReduceSum(x, a) }",
     {"x": np.zeros((2, 3), np.float32), "a": i64(2)}, 13, r"axes 2 is out of range for a rank-2 tensor"),
    ("g (float[3,1] x, int64[2] s) => (float y) { y = Expand(x, s) }",
     {"x": np.zeros((3, 1), np.float32), "s": i64(2, 4)}, 13, r"cannot expand shape \[3, 1\] to \[2, 4\]"),
    ("g (int64[2] i, int64 d, float[2] v) => (float y) { y = OneHot(i, d, v) }",
     {"i": i64(0, 1), "d": np.array(0, np.int64), "v": np.zeros(2, np.float32)}, 11, r"depth must be positive"),
    ("g (float[2,3] x, int64[2,1] i) => (float y) { y = GatherND(x, i) }",
     {"x": np.zeros((2, 3), np.float32), "i": np.array([[0], [-3]], np.int64)}, 13,
     r"index -3 is out of range for an axis of size 2"),
    ("g (int32 a, int32 b, int32 c) => (int32 y) { y = Range(a, b, c) }",
     {"a": np.array(0, np.int32), "b": np.array(5, np.int32), "c": np.array(0, np.int32)}, 11,
     r"delta must be non-zero"),
])
def test_bad_runtime_input_raises_backend_error_naming_node(text, feeds, opset, match):
    case = Case("error", text, feeds, opset=opset)
    model = parse(case)
    for output in model.graph.output:  # declared rank-1 outputs: the run fails before they matter
        output.type.tensor_type.shape.dim.add().dim_param = "n"
    model.graph.node[0].name = "the_node"
    with pytest.raises(BackendError, match=r"'the_node'") as info:
        run_numpy(case, model)
    assert info.match(match)
