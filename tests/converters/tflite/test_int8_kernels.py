"""Integer kernels (``edgeinfer::TFLite*``) against TFLite's builtin int8 kernels, exactly.

Each case is a small TensorFlow function converted to a full-integer model by TF's own
converter (calibrated on random data); the inputs then sweep the whole int8 range, so
saturation, fused-activation clamps and every RSQRT level are exercised."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close

tf = pytest.importorskip("tensorflow")
litert = pytest.importorskip("ai_edge_litert.interpreter")

_W = np.random.default_rng(7).standard_normal((6, 5)).astype(np.float32)

# name -> (edgeinfer op that must appear, function, input shapes)
CASES = {
    "add_relu": ("TFLiteAdd", lambda a, b: tf.nn.relu(a + b), [(4, 8), (4, 8)]),
    "sub_broadcast": ("TFLiteSub", lambda a, b: a - b[:1], [(4, 8), (4, 8)]),
    "mul_relu6": ("TFLiteMul", lambda a, b: tf.nn.relu6(a * b * 3.0), [(4, 8), (4, 8)]),
    "squared_difference": ("TFLiteSquaredDifference", lambda a, b: tf.math.squared_difference(a, b), [(4, 8), (4, 8)]),
    "rsqrt": ("TFLiteRsqrt", lambda a: tf.math.rsqrt(tf.abs(a) + 0.05), [(16, 16)]),
    "softmax": ("TFLiteSoftmax", lambda a: tf.nn.softmax(a * 2.0), [(4, 9)]),
    "mean": ("TFLiteMean", lambda a: tf.reduce_mean(a * a, axis=-1, keepdims=True), [(4, 8)]),
    "fully_connected": ("TFLiteFullyConnected", lambda a: tf.nn.relu(tf.matmul(a, _W.T) + 0.1), [(4, 5)]),
    "batch_matmul_adjoint": ("TFLiteBatchMatMul", lambda a, b: tf.linalg.matmul(a, b, transpose_b=True),
                             [(2, 3, 4), (2, 5, 4)]),
}


def _int8_model(fn, shapes) -> bytes:
    signature = [tf.TensorSpec(shape, tf.float32) for shape in shapes]
    concrete = tf.function(fn, input_signature=signature).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    rng = np.random.default_rng(0)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([rng.standard_normal(s).astype(np.float32) for s in shapes]
                                                for _ in range(8))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    return bytes(converter.convert())


@pytest.mark.parametrize("case", sorted(CASES))
def test_integer_kernel_is_bit_exact(case):
    op, fn, shapes = CASES[case]
    data = _int8_model(fn, shapes)
    model = ei.convert(data)
    assert op in {n.op_type for n in model.graph.nodes if n.domain == "edgeinfer"}
    interpreter = litert.Interpreter(model_content=data,
                                     experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter.allocate_tensors()
    details = sorted(interpreter.get_input_details(), key=lambda d: d["index"])
    rng = np.random.default_rng(1)
    for trial in range(3):
        feeds = [rng.integers(-128, 128, shape).astype(np.int8) for shape in shapes]
        if case == "rsqrt" and trial == 0:  # every level once
            feeds = [np.arange(-128, 128, dtype=np.int8).reshape(shapes[0])]
        for detail, value in zip(details, feeds, strict=True):
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
        expected = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        (got,) = ei.Session(model).run({i.name: v for i, v in zip(model.inputs, feeds, strict=True)}).values()
        assert_close(got, expected, name=f"{case}[{trial}]")
