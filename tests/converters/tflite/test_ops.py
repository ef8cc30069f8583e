"""Per-op numerics: small TensorFlow functions converted by TF's TFLite converter, imported
by edgeinfer and compared with the TFLite interpreter on the same inputs. Each case names
the TFLite builtin it exists to cover, and the test asserts the file contains it."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close

tf = pytest.importorskip("tensorflow")
litert = pytest.importorskip("ai_edge_litert.interpreter")

F = "float32"
INT = "int32"

_PRELU = tf.keras.layers.PReLU(alpha_initializer=tf.keras.initializers.Constant(0.25), shared_axes=[1])
_PRELU.build((None, 4, 3))

# name -> (TFLite op that must appear, function, [(shape, dtype)...])
CASES = {
    "floor_div_float": ("FLOOR_DIV", lambda a, b: tf.math.floordiv(a, b + 3.0), [((2, 5), F), ((2, 5), F)]),
    "floor_div_int": ("FLOOR_DIV", lambda a, b: tf.math.floordiv(a, tf.where(b == 0, 1, b)), [((12,), INT), ((12,), INT)]),
    "floor_mod_float": ("FLOOR_MOD", lambda a, b: tf.math.floormod(a, b + 3.0), [((2, 5), F), ((2, 5), F)]),
    "floor_mod_int": ("FLOOR_MOD", lambda a, b: tf.math.floormod(a, tf.where(b == 0, 1, b)), [((12,), INT), ((12,), INT)]),
    "strided_slice_masks": ("STRIDED_SLICE", lambda x: x[:, 1:-1:2, ::-1] * 2.0, [((2, 7, 5), F)]),
    "strided_slice_shrink": ("STRIDED_SLICE", lambda x: x[:, 2] + 1.0, [((2, 7, 5), F)]),
    "slice": ("SLICE", lambda x: tf.slice(x, [0, 1, 0], [-1, 2, 3]) + 1.0, [((2, 4, 5), F)]),
    "pad": ("PAD", lambda x: tf.pad(x, [[0, 0], [1, 2], [2, 1]]) * 2.0, [((1, 3, 4), F)]),
    "pad_value": ("PADV2", lambda x: tf.pad(x, [[0, 0], [1, 0], [0, 2]], constant_values=1.5), [((1, 3, 4), F)]),
    "mirror_pad": ("MIRROR_PAD", lambda x: tf.pad(x, [[0, 0], [1, 2], [2, 1]], mode="REFLECT"), [((1, 4, 5), F)]),
    "gather": ("GATHER", lambda x, i: tf.gather(x, tf.math.floormod(i, 4), axis=1), [((3, 4, 2), F), ((5,), INT)]),
    "gather_nd": ("GATHER_ND", lambda x: tf.gather_nd(x, [[0, 1], [2, 3], [1, 0]]), [((3, 4, 2), F)]),
    "top_k": ("TOPK_V2", lambda x: tf.math.top_k(x, k=3), [((2, 7), F)]),
    "arg_max": ("ARG_MAX", lambda x: tf.argmax(x, axis=1, output_type=tf.int32), [((3, 6), F)]),
    "arg_min": ("ARG_MIN", lambda x: tf.argmin(x, axis=-1), [((3, 6), F)]),
    "depth_to_space": ("DEPTH_TO_SPACE", lambda x: tf.nn.depth_to_space(x, 2), [((1, 3, 3, 8), F)]),
    "space_to_depth": ("SPACE_TO_DEPTH", lambda x: tf.nn.space_to_depth(x, 2), [((1, 4, 6, 3), F)]),
    "resize_nearest_align": ("RESIZE_NEAREST_NEIGHBOR", lambda x: tf.compat.v1.image.resize_nearest_neighbor(
        x, (7, 9), align_corners=True), [((1, 4, 5, 2), F)]),
    "resize_nearest_half_pixel": ("RESIZE_NEAREST_NEIGHBOR", lambda x: tf.image.resize(
        x, (7, 9), method="nearest"), [((1, 4, 5, 2), F)]),
    "resize_bilinear_align": ("RESIZE_BILINEAR", lambda x: tf.compat.v1.image.resize_bilinear(
        x, (7, 9), align_corners=True), [((1, 4, 5, 2), F)]),
    "resize_bilinear_legacy": ("RESIZE_BILINEAR", lambda x: tf.compat.v1.image.resize_bilinear(
        x, (7, 9)), [((1, 4, 5, 2), F)]),
    "leaky_relu": ("LEAKY_RELU", lambda x: tf.nn.leaky_relu(x, 0.3), [((2, 6), F)]),
    "gelu_exact": ("GELU", lambda x: tf.nn.gelu(x, approximate=False), [((2, 6), F)]),
    "gelu_tanh": ("GELU", lambda x: tf.nn.gelu(x, approximate=True), [((2, 6), F)]),
    "hard_swish": ("HARD_SWISH", lambda x: x * tf.nn.relu6(x + 3.0) / 6.0, [((2, 6), F)]),
    "elu": ("ELU", tf.nn.elu, [((2, 6), F)]),
    "prelu": ("PRELU", lambda x: _PRELU(x), [((2, 4, 3), F)]),
    "log_softmax": ("LOG_SOFTMAX", tf.nn.log_softmax, [((2, 6), F)]),
    "reductions": ("REDUCE_PROD", lambda x: (tf.reduce_sum(x, 1, keepdims=True), tf.reduce_max(x, [0, 2]),
                                            tf.reduce_min(x, -1), tf.reduce_prod(x, 1)), [((2, 3, 4), F)]),
    "split": ("SPLIT", lambda x: tf.split(x, 3, axis=1), [((2, 6), F)]),
    "split_v": ("SPLIT_V", lambda x: tf.split(x, [1, -1, 2], axis=1), [((2, 6), F)]),
    "unpack_pack": ("UNPACK", lambda x: tf.stack(tf.unstack(x, axis=1)[::-1], axis=0), [((2, 3, 4), F)]),
    "tile_broadcast": ("BROADCAST_TO", lambda x: (tf.tile(x, [2, 3]), tf.broadcast_to(x[:1], [4, 3])),
                       [((2, 1), F)]),
    "select_broadcast": ("SELECT_V2", lambda a: tf.where(a > 0.2, a, 0.0), [((3, 4), F)]),
    "select_compare": ("SELECT", lambda a, b: tf.where(tf.logical_and(a > 0, b < 0.5), a, b * 2.0),
                       [((3, 4), F), ((3, 4), F)]),
    "compare_cast": ("NOT_EQUAL", lambda a, b: tf.cast(tf.logical_or(a >= b, tf.not_equal(a, b)), tf.float32)
                     + tf.cast(a <= b, tf.float32), [((3, 4), F), ((3, 4), F)]),
    "unary_math": ("RSQRT", lambda x: (tf.math.rsqrt(tf.abs(x) + 1), tf.sqrt(tf.abs(x)), tf.exp(x),
                                       tf.math.log(tf.abs(x) + 1), tf.sin(x), tf.cos(x), tf.floor(x), tf.math.ceil(x),
                                       tf.round(x), -x, tf.sign(x), tf.square(x)), [((3, 4), F)]),
    "binary_math": ("SQUARED_DIFFERENCE", lambda a, b: (tf.math.squared_difference(a, b), tf.maximum(a, b),
                                                        tf.minimum(a, b), tf.pow(tf.abs(a), b)),
                    [((3, 4), F), ((3, 4), F)]),
    "batch_matmul_adjoint": ("BATCH_MATMUL", lambda a, b: tf.linalg.matmul(a, b, transpose_a=True, transpose_b=True),
                             [((2, 4, 3), F), ((2, 5, 4), F)]),
    "shape_ops": ("TRANSPOSE", lambda x: tf.squeeze(tf.expand_dims(tf.transpose(x, [2, 0, 1]), 1), [1]) + 1.0,
                  [((2, 3, 4), F)]),
    "dilated_conv": ("CONV_2D", lambda x: tf.nn.conv2d(x, tf.constant(np.linspace(-1, 1, 3 * 3 * 2 * 4, dtype=np.float32)
                                                                      .reshape(3, 3, 2, 4)), 1, "SAME", dilations=2),
                     [((1, 9, 9, 2), F)]),
    "depthwise_multiplier": ("DEPTHWISE_CONV_2D", lambda x: tf.nn.depthwise_conv2d(
        x, tf.constant(np.linspace(-1, 1, 3 * 3 * 2 * 2, dtype=np.float32).reshape(3, 3, 2, 2)),
        [1, 2, 2, 1], "SAME"), [((1, 8, 7, 2), F)]),
    "average_pool_same": ("AVERAGE_POOL_2D", lambda x: tf.nn.avg_pool2d(x, 3, 2, "SAME"), [((1, 7, 6, 2), F)]),
    "range_fill": ("RANGE", lambda n: tf.cast(tf.range(0, tf.reduce_max(tf.abs(n)) + 2, 1), tf.float32) +
                   tf.fill([3], 0.5)[0], [((3,), INT)]),
}


def _inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [tuple(2 if d is None else d for d in shape) for shape, _ in specs]
    return [rng.integers(-9, 10, shape).astype(dtype) if dtype == INT else rng.standard_normal(shape).astype(dtype)
            for shape, (_, dtype) in zip(shapes, specs, strict=True)]


def _flatbuffer(fn, specs) -> bytes:
    signature = [tf.TensorSpec(shape, dtype) for shape, dtype in specs]
    concrete = tf.function(fn, input_signature=signature).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_interpreter(case):
    op, fn, specs = CASES[case]
    data = _flatbuffer(fn, specs)
    interpreter = litert.Interpreter(model_content=data)
    interpreter.allocate_tensors()
    assert op in {d["op_name"] for d in interpreter._get_ops_details()}, f"TF did not emit {op} for {case}"
    feeds = _inputs(specs)
    for detail, value in zip(sorted(interpreter.get_input_details(), key=lambda d: d["index"]), feeds, strict=True):
        if tuple(detail["shape"]) != value.shape:
            interpreter.resize_tensor_input(detail["index"], value.shape)
    interpreter.allocate_tensors()
    for detail, value in zip(sorted(interpreter.get_input_details(), key=lambda d: d["index"]), feeds, strict=True):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    expected = {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}

    model = ei.convert(data)
    got = ei.Session(model).run({info.name: value for info, value in zip(model.inputs, feeds, strict=True)})
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert_close(got[name], value, rtol=1e-5, atol=1e-6, name=f"{case}:{name}")
