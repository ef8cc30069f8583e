"""The reference architectures of ``devkit.zoo``, run by onnxruntime: valid ONNX, the real
architectures' parameter counts, deterministic per seed, and realistic activations (unit-ish
scale inside, non-degenerate outputs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from devkit import zoo

SMALL = {  # builder name -> keyword arguments that keep the test fast
    "cnn_residual_depthwise": {},
    "transformer_encoder_block": {},
    "mlp_symbolic_batch": {},
    "mobilenet_v2": {"size": 64},
    "resnet50": {"size": 64},
}
NORMALIZATIONS = ("BatchNormalization", "LayerNormalization")


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict:
    """Run with onnxruntime; ``outputs`` may name intermediate values."""
    if outputs:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        del model.graph.output[:]
        model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def learnable_parameters(model: onnx.ModelProto) -> int:
    """Weights, biases, BN scale/shift; not BN running statistics nor Clip bounds."""
    buffers = (".mean", ".var", ".min", ".max")
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer if not t.name.endswith(buffers))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_builds_valid_deterministic_models(name):
    build = zoo.BUILDERS[name]
    model = build(seed=11, **SMALL[name])
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == zoo.OPSET
    assert model.SerializeToString() == build(seed=11, **SMALL[name]).SerializeToString()
    assert model.SerializeToString() != build(seed=12, **SMALL[name]).SerializeToString()


@pytest.mark.parametrize("name", sorted(SMALL))
def test_outputs_are_not_degenerate(name):
    model = zoo.BUILDERS[name](**SMALL[name])
    first = run(model, zoo.example_inputs(model, seed=1, batch=3))
    second = run(model, zoo.example_inputs(model, seed=2, batch=3))
    for output, value in first.items():
        assert np.isfinite(value).all(), output
        assert value.std() > 1e-3, f"{output}: std {value.std()}"
        assert np.abs(value - second[output]).max() > 1e-3, f"{output} does not depend on the input"
        if value.shape[0] == 3:
            assert np.abs(value[0] - value[1]).max() > 1e-3, f"{output}: same result for two samples"


@pytest.mark.parametrize("name", ["cnn_residual_depthwise", "transformer_encoder_block", "mobilenet_v2",
                                  "resnet50"])
def test_normalized_activations_keep_a_unit_scale(name):
    """What a trained network shows: BatchNormalization/LayerNormalization outputs of a standard
    normal input have a standard deviation of order one at every depth."""
    model = zoo.BUILDERS[name](**SMALL[name])
    names = [node.output[0] for node in model.graph.node if node.op_type in NORMALIZATIONS]
    values = run(model, zoo.example_inputs(model, seed=4, batch=2), names)
    scales = {n: float(v.std()) for n, v in values.items()}
    off = {n: round(s, 3) for n, s in scales.items() if not 0.3 < s < 2.0}
    assert not off, f"activations far from unit scale: {off}"


def test_resnet50_is_the_real_architecture():
    model = zoo.resnet50()
    assert learnable_parameters(model) == 25_557_032  # torchvision.models.resnet50
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 53  # stem + 16 bottlenecks x 3 + 4 downsample projections
    logits = run(model, zoo.example_inputs(model))["logits"]
    assert logits.shape == (1, 1000) and np.isfinite(logits).all() and logits.std() > 0.1


def test_mobilenet_v2_is_the_real_architecture():
    model = zoo.mobilenet_v2()
    assert learnable_parameters(model) == 3_504_872  # torchvision.models.mobilenet_v2
    depthwise = [n for n in model.graph.node if n.op_type == "Conv"
                 and helper.get_attribute_value(next(a for a in n.attribute if a.name == "group")) > 1]
    assert len(depthwise) == 17


def test_batchnorm_statistics_are_those_of_the_input():
    """Running mean/var of each BatchNormalization match the statistics its input really has
    (what training stores), not placeholders."""
    model = zoo.cnn_residual_depthwise(size=32, seed=3)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = run(model, zoo.example_inputs(model, seed=0, batch=16), [n.input[0] for n in bns])
    for node in bns:
        observed = values[node.input[0]]
        mean, var = observed.mean(axis=(0, 2, 3)), observed.var(axis=(0, 2, 3))
        ratio = var / inits[node.input[4]]
        assert 0.5 < np.median(ratio) < 2.0, node.name
        assert np.median(np.abs(mean - inits[node.input[3]]) / np.sqrt(var)) < 0.3, node.name
