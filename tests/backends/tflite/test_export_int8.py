"""INT8 export: a QDQ model from ``edgeinfer.quantize`` becomes a full-integer .tflite whose
int8 ops agree with edgeinfer's numpy backend within one quantization step, op by op
(teacher forcing: each op reads the interpreter's own int8 inputs, so errors do not
accumulate through the network as they would in a whole-model comparison)."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.format.tflite import export_tflite

from .conftest import opcodes, run_flatbuffer, teacher_forced_steps

INT8_ZOO = ("cnn_residual_depthwise", "mobilenet_v2", "transformer_encoder_block")


@pytest.mark.parametrize("activations", ["int8", "uint8"])
@pytest.mark.parametrize("name", INT8_ZOO)
def test_each_int8_op_within_one_step(quantized_zoo, zoo_models, name, activations):
    model = quantized_zoo(name, activations)
    data = export_tflite(model.graph)
    steps = teacher_forced_steps(model, data, zoo.example_inputs(zoo_models[name], seed=11))
    assert steps, "no int8 tensor was compared"
    worst = max(steps, key=steps.get)
    assert steps[worst] <= 1, f"{worst}: {steps[worst]} steps"


@pytest.mark.parametrize("name", INT8_ZOO)
def test_integer_kernels_do_the_work(quantized_zoo, name):
    """Convolutions and fully connected layers run on int8: no DEQUANTIZE feeds them, and the
    file holds int8 weights with per-channel scales."""
    from edgeinfer.converters.tflite.reader import read_model

    data = export_tflite(quantized_zoo(name, "int8").graph)
    subgraph = read_model(data).subgraphs[0]
    heavy = [op for op in subgraph.operators if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]
    int8_heavy = [op for op in heavy if subgraph.tensors[op.inputs[0]].type_name == "INT8"]
    assert int8_heavy
    weights = [subgraph.tensors[op.inputs[1]] for op in int8_heavy]
    assert all(w.type_name == "INT8" and w.quant is not None and not w.quant.zero_point.any() for w in weights)
    assert any(w.quant.per_channel for w in weights)
    if name != "transformer_encoder_block":  # LayerNorm and GELU stay float between int8 layers there
        assert opcodes(data).count("DEQUANTIZE") <= 1


@pytest.mark.parametrize("name", ["cnn_residual_depthwise", "mobilenet_v2"])
def test_whole_model_agrees(quantized_zoo, zoo_models, name):
    """End to end the per-op steps accumulate; the predictions still agree."""
    model = quantized_zoo(name, "int8")
    feeds = zoo.example_inputs(zoo_models[name], seed=12, batch=1)
    (expected,) = ei.Session(model).run(feeds).values()
    (got,) = run_flatbuffer(export_tflite(model.graph), feeds, "xnnpack")
    assert got.argmax() == expected.argmax()
    cosine = float(np.dot(got.ravel(), expected.ravel()) / np.linalg.norm(got) / np.linalg.norm(expected))
    assert cosine > 0.99


def test_int8_file_reimports_with_same_outputs(quantized_zoo, zoo_models, tmp_path):
    model = quantized_zoo("cnn_residual_depthwise", "int8")
    path = tmp_path / "cnn.int8.tflite"
    ei.export(model, path)
    feeds = zoo.example_inputs(zoo_models["cnn_residual_depthwise"], seed=13)
    reimported = ei.convert(path, dynamic_batch=False)
    (got,) = ei.Session(reimported).run(dict(zip(reimported.graph.input_names, feeds.values(), strict=True))).values()
    (interpreted,) = run_flatbuffer(path.read_bytes(), feeds)
    # The importer's QDQ reading of the file agrees with the interpreter running it.
    assert_close(got, interpreted, rtol=0.02, atol=0.02 * float(np.abs(interpreted).max()))
