"""The same Keras models as ``.tflite`` files (fp32 and full INT8), against the TFLite
interpreter (ai-edge-litert) on the same inputs.

INT8 oracle: the interpreter's builtin CPU kernels (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``),
which define TFLite's integer arithmetic. The default resolver hands FULLY_CONNECTED, ADD,
MUL and MEAN to the XNNPACK delegate, whose requantization rounds differently: on these
models XNNPACK and the builtin kernels disagree by up to 3 steps (encoder block, unrolled
LSTM), so no importer can be within one step of both. The recurrent INT8 models are unrolled
by ``to_tflite`` (a rolled Keras RNN's WHILE loop crashes TF's quantizer)."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.ir import Graph, Value
from edgeinfer.model import Model

interpreter_module = pytest.importorskip("ai_edge_litert.interpreter")
BUILTIN_KERNELS = interpreter_module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES


def _interpreter(path, **kwargs):
    return interpreter_module.Interpreter(model_path=str(path), **kwargs)


def _interpreter_run(path, x: np.ndarray, **kwargs) -> np.ndarray:
    interpreter = _interpreter(path, **kwargs)
    detail = interpreter.get_input_details()[0]
    if tuple(detail["shape"]) != x.shape:
        interpreter.resize_tensor_input(detail["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def _quantize_input(path, x: np.ndarray) -> np.ndarray:
    detail = _interpreter(path).get_input_details()[0]
    scale, zero = detail["quantization"]
    return np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8)


def _edgeinfer_run(path, x: np.ndarray, backend: str = "numpy") -> np.ndarray:
    model = ei.convert(path)
    (out,) = ei.Session(model, backend=backend).run({model.inputs[0].name: x}).values()
    return out


def test_fp32_matches_interpreter(model_name, tflite_files, keras_models, make_input):
    fp32, _ = tflite_files[model_name]
    x = make_input(keras_models[model_name])
    assert_close(_edgeinfer_run(fp32, x), _interpreter_run(fp32, x), rtol=1e-4, atol=1e-5)


def test_int8_within_one_step(model_name, tflite_files, keras_models, make_input):
    _, int8 = tflite_files[model_name]
    x = _quantize_input(int8, make_input(keras_models[model_name]))
    expected = _interpreter_run(int8, x, experimental_op_resolver_type=BUILTIN_KERNELS)
    got = _edgeinfer_run(int8, x)
    assert got.dtype == np.int8
    # Ops with an edgeinfer::TFLite* kernel are bit-exact; the QDQ-imported rest (CONV_2D,
    # AVERAGE_POOL_2D, ...) round once in float where TFLite rounds in fixed point.
    assert_close(got, expected, int_steps=1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_int8_encoder_block_is_bit_exact(seed, tflite_files, keras_models, make_input):
    """Every quantized op of the MultiHeadAttention + LayerNormalization block runs an
    integer kernel, so the whole model equals TFLite's builtin kernels exactly."""
    _, int8 = tflite_files["encoder_block"]
    x = _quantize_input(int8, make_input(keras_models["encoder_block"], seed=seed) * seed)
    expected = _interpreter_run(int8, x, experimental_op_resolver_type=BUILTIN_KERNELS)
    assert_close(_edgeinfer_run(int8, x), expected)


def test_int8_integer_kernels_lower_for_onnxruntime(tflite_files, keras_models, make_input):
    pytest.importorskip("onnxruntime")
    _, int8 = tflite_files["encoder_block"]
    graph = ei.convert(int8).graph
    assert {n.op_type for n in graph.nodes if n.domain == "edgeinfer"} >= {
        "TFLiteFullyConnected", "TFLiteBatchMatMul", "TFLiteSoftmax", "TFLiteRsqrt", "TFLiteMean",
        "TFLiteSquaredDifference", "TFLiteAdd", "TFLiteMul"}
    x = _quantize_input(int8, make_input(keras_models["encoder_block"]))
    got = _edgeinfer_run(int8, x, backend="onnxruntime")
    # The lowering is dequantize -> float op -> quantize, not TFLite's fixed point: the
    # LayerNorms amplify its one-step differences (measured: 2 steps).
    assert_close(got, _edgeinfer_run(int8, x), int_steps=3)


def test_int8_each_op_matches(model_name, tflite_files, keras_models, make_input):
    """Teacher forcing: every int8 activation an op reads is the interpreter's own tensor, so
    each op's output measures that op's error alone: integer kernels exactly, QDQ ops within
    one step."""
    _, int8 = tflite_files[model_name]
    x = _quantize_input(int8, make_input(keras_models[model_name]))
    interpreter = _interpreter(int8, experimental_preserve_all_tensors=True,
                               experimental_op_resolver_type=BUILTIN_KERNELS)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    reference = {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_tensor_details()
                 if d["dtype"] == np.int8}
    graph = ei.convert(int8, optimize=0).graph
    forced: dict[str, Value] = {}

    def force(name: str) -> str:
        if name not in reference or graph.values[name].const is not None or graph.values[name].dtype != "int8":
            return name
        forced.setdefault(name, Value(f"{name}__reference", "int8", reference[name].shape))
        return forced[name].name

    nodes, steps = [], {}
    for node in graph.nodes:
        if node.op_type == "DequantizeLinear" or node.domain == "edgeinfer":
            node = node.with_(inputs=tuple(force(name) for name in node.inputs))
        nodes.append(node)
        for out in node.outputs:
            if out in reference and (node.op_type == "QuantizeLinear" or node.domain == "edgeinfer"):
                steps[out] = 0 if node.domain == "edgeinfer" else 1
    assert steps, "no requantized tensor to compare"
    forced_graph = Graph(nodes, list(graph.inputs) + list(forced.values()),
                         [graph.values[name].typed_like() for name in steps], graph.initializers,
                         opset=graph.opset)
    feeds = {graph.input_names[0]: x, **{v.name: reference[k] for k, v in forced.items()}}
    results = ei.Session(Model(forced_graph)).run(feeds)
    for name, allowed in steps.items():
        assert_close(results[name], reference[name], int_steps=allowed, name=name)


def test_int8_imports_as_qdq(tflite_files):
    _, int8 = tflite_files["separable_net"]
    histogram = ei.convert(int8).graph.op_histogram()
    assert histogram["QuantizeLinear"] > 0 and histogram["DequantizeLinear"] > 0
    assert histogram["Conv"] == 5


def test_per_channel_weights_keep_their_axis(tflite_files):
    _, int8 = tflite_files["small_cnn"]
    graph = ei.convert(int8).graph
    per_axis = [n for n in graph.nodes if n.op_type == "DequantizeLinear"
                and graph.values[n.inputs[1]].const is not None and graph.values[n.inputs[1]].const.size > 1]
    assert per_axis, "expected per-channel dequantization of conv weights"
    for node in per_axis:
        weights = graph.values[node.inputs[0]].const
        assert weights.dtype in (np.int8, np.int32)
        assert weights.shape[node.attrs.get("axis", 1)] == graph.values[node.inputs[1]].const.size


def test_batch_of_three_on_dynamic_model(tflite_files, keras_models, make_input):
    fp32, _ = tflite_files["residual_net"]
    x = make_input(keras_models["residual_net"], batch=3)
    assert_close(_edgeinfer_run(fp32, x), _interpreter_run(fp32, x), rtol=1e-4, atol=1e-5)


def test_fp16_weights_are_stored_weights_not_casts(keras_models, make_input):
    tf = pytest.importorskip("tensorflow")
    model = keras_models["separable_net"]
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    data = converter.convert()
    raw = ei.convert(data, optimize=0).graph
    from edgeinfer.ir.weights import stored_weight_dtype

    assert not [n for n in raw.nodes if n.op_type == "Cast" and raw.values[n.inputs[0]].const is not None]
    assert any(stored_weight_dtype(raw, name) == "float16" for name in raw.initializers)  # kept fp16 in the .eim
    converted = ei.convert(data)
    x = make_input(model)
    interpreter = interpreter_module.Interpreter(model_content=data)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    expected = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    (got,) = ei.Session(converted).run({converted.inputs[0].name: x}).values()
    assert_close(got, expected, rtol=1e-4, atol=1e-5)
