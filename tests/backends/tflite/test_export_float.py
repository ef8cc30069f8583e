"""Float export: the zoo models (at every optimization level) written as .tflite and run by
the TFLite interpreter match edgeinfer's numpy backend, and re-import with the same outputs."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.format.tflite import export_tflite

from .conftest import ZOO, opcodes, run_flatbuffer

FP32 = {"rtol": 1e-4, "atol": 1e-5}  # the fp32 budget: kernels sum in a different order


@pytest.mark.parametrize("optimize", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("resolver", ["builtin", "xnnpack"])
def test_zoo_matches_numpy_backend(zoo_models, name, optimize, resolver):
    model = ei.convert(zoo_models[name], optimize=optimize)
    feeds = zoo.example_inputs(zoo_models[name], seed=3, batch=2)
    expected = ei.Session(model).run(feeds)
    got = run_flatbuffer(export_tflite(model.graph), feeds, resolver)
    for (output, ref), value in zip(expected.items(), got, strict=True):
        assert_close(value, ref, name=output, **FP32)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_exported_file_reimports_with_same_outputs(zoo_models, name, tmp_path):
    model = ei.convert(zoo_models[name], optimize=2)
    path = tmp_path / f"{name}.tflite"
    ei.export(model, path)
    feeds = zoo.example_inputs(zoo_models[name], seed=4)
    reimported = ei.convert(path, dynamic_batch=False)
    reimported.graph.verify()
    expected = ei.Session(model).run(feeds)
    got = ei.Session(reimported).run(dict(zip(reimported.graph.input_names, feeds.values(), strict=True)))
    for (output, ref), value in zip(expected.items(), got.values(), strict=True):
        assert_close(value, ref, name=output, **FP32)


def test_convolutions_stay_nhwc(zoo_models):
    """Layout bookkeeping: one TRANSPOSE for the NCHW input, none between layers."""
    data = export_tflite(ei.convert(zoo_models["mobilenet_v2"], optimize=2).graph)
    ops = opcodes(data)
    assert ops.count("TRANSPOSE") == 1
    assert ops.count("CONV_2D") + ops.count("DEPTHWISE_CONV_2D") == 52


def test_fused_activations_become_fused_activation_function(zoo_models):
    from edgeinfer.converters.tflite.reader import read_model, read_options

    data = export_tflite(ei.convert(zoo_models["mobilenet_v2"], optimize=2).graph)
    convs = [op for op in read_model(data).subgraphs[0].operators if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    codes = [read_options(op, "Conv2DOptions" if op.opcode == "CONV_2D" else "DepthwiseConv2DOptions", "t")
             ["fused_activation_function"] for op in convs]
    assert codes.count(3) == 35  # every Conv+BN+ReLU6 of MobileNetV2 as RELU6
    assert "RELU6" not in opcodes(data)


def test_symbolic_batch_resizes(zoo_models):
    model = ei.convert(zoo_models["mlp_symbolic_batch"])
    data = export_tflite(model.graph)
    for batch in (1, 5):
        feeds = zoo.example_inputs(zoo_models["mlp_symbolic_batch"], seed=batch, batch=batch)
        (got,) = run_flatbuffer(data, feeds)
        assert_close(got, ei.Session(model).run(feeds)["probs"], **FP32)
    assert np.asarray(got).shape == (5, 10)


def test_fp16_weights_of_dense_and_prelu_stay_fp16_and_delegated(tmp_path):
    """Dense and PReLU layers of a float16-weight file re-export as the original has them: the
    weights and slopes float16 behind DEQUANTIZE (written as float32 constants, XNNPACK left those
    FULLY_CONNECTEDs to the builtin kernels, splitting MediaPipe's hand landmark model into two
    delegate partitions; a PRelu slope moved across a layout Transpose lost its float16 storage),
    the same operators, one XNNPACK partition, LiteRT's outputs."""
    tf = pytest.importorskip("tensorflow")
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    x = tf.keras.Input((8, 8, 3), batch_size=1)
    y = tf.keras.layers.PReLU(shared_axes=[1, 2])(tf.keras.layers.Conv2D(16, 3)(x))
    y = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(16, 3, activation="relu")(y))
    keras_model = tf.keras.Model(x, [tf.keras.layers.Dense(1, activation="sigmoid")(y), tf.keras.layers.Dense(5)(y)])
    converter = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    original = tmp_path / "fp16_dense.tflite"
    original.write_bytes(converter.convert())
    exported = tmp_path / "again.tflite"
    ei.export(ei.convert(original), exported)

    def plan(path):
        interpreter = litert.Interpreter(model_path=str(path), num_threads=1)
        interpreter.allocate_tensors()
        feed = np.random.default_rng(5).standard_normal((1, 8, 8, 3)).astype(np.float32)
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], feed)
        interpreter.invoke()
        outputs = sorted((interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()),
                         key=lambda a: a.shape)
        delegated = sum(op["op_name"] == "DELEGATE" for op in interpreter._get_ops_details())
        return outputs, delegated

    from edgeinfer.converters.tflite.reader import read_model

    def weight_makers(path):
        graph = read_model(path.read_bytes()).subgraphs[0]
        made = {t: op.opcode for op in graph.operators for t in op.outputs}
        return [made.get(op.inputs[1]) for op in graph.operators if op.opcode in ("FULLY_CONNECTED", "PRELU")]

    assert weight_makers(exported) == weight_makers(original) == ["DEQUANTIZE"] * 3
    assert sorted(o for o in opcodes(exported.read_bytes()) if o != "RELU") == \
        sorted(o for o in opcodes(original.read_bytes()) if o != "RELU")
    (want, delegated_original), (got, delegated) = plan(original), plan(exported)
    assert delegated == delegated_original == 1
    for value, ref in zip(got, want, strict=True):
        assert_close(value, ref, **FP32)
