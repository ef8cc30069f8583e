"""Weight-only INT8 (``quantize(activations="float")``, ``static.int8_weights_only``): every layer
float on int8 weights, one scale per output channel, biases and PReLU slopes as float16 values.
Checked against fp32 and plain INT8 on held-out inputs, in memory and after a save and load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import sqnr

import edgeinfer as ei
from edgeinfer.errors import InputError
from edgeinfer.format.sizes import size_breakdown
from edgeinfer.ir.weights import int8_factors, int8_stored_weights, stored_weights
from edgeinfer.quantize import quantize
from edgeinfer.quantize.guard import QuantizationSpeedWarning

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 16, 16] x) => (float[N, 10] y) {
    a = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    b = PRelu(a, slope)
    c = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (b, w2, b2)
    d = Relu(c)
    e = GlobalAveragePool(d)
    f = Flatten(e)
    y = Gemm <transB = 1> (f, w3, b3)
}
"""
WEIGHTS = {"w1": (16, 3, 3, 3), "w2": (32, 16, 3, 3), "w3": (10, 32)}


@pytest.fixture(scope="module")
def net():
    import onnx
    from onnx import numpy_helper, parser

    rng = np.random.default_rng(7)
    arrays = {name: (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
              for name, shape in WEIGHTS.items()}
    arrays.update(b1=rng.normal(0, 0.1, 16), b2=rng.normal(0, 0.1, 32), b3=rng.normal(0, 0.1, 10),
                  slope=rng.uniform(0.05, 0.3, (16, 1, 1)))
    proto = parser.parse_model(TEXT)
    proto.graph.initializer.extend(numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in arrays.items())
    onnx.checker.check_model(proto)
    fp32 = ei.convert(proto)
    smooth = np.cumsum(np.cumsum(rng.standard_normal((40, 1, 3, 16, 16)), axis=-1), axis=-2).astype(np.float32) / 8
    return fp32, [{"x": x} for x in smooth[:32]], [{"x": x} for x in smooth[32:]]


def _weights_of(graph) -> dict[str, str]:
    """``{ONNX weight name: its initializer name}``: the Conv/Gemm weights by output channels."""
    found = {}
    for node in graph.nodes:
        if node.op_type in ("Conv", "Gemm"):
            shape = graph.initializers[node.inputs[1]].shape
            found[next(name for name, want in WEIGHTS.items() if want == shape)] = node.inputs[1]
    return found


def _sqnr(reference: ei.Model, model: ei.Model, feeds, backend: str) -> float:
    want = np.concatenate([ei.Session(reference, backend=backend).run(f)["y"] for f in feeds])
    got = np.concatenate([ei.Session(model, backend=backend).run(f)["y"] for f in feeds])
    return sqnr(want, got)


def test_weight_only_int8_keeps_every_layer_float_on_int8_weights_and_beats_plain_int8(net, tmp_path):
    fp32, samples, held_out = net
    q = quantize(fp32, samples, activations="float")
    graph = q.graph
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(graph.op_histogram())  # no activation is quantized
    summary = json.loads(q.metadata["quantization"])
    assert summary["activations"] == "float" and summary["layers"] == 0 and summary["float32_weights"] == []
    assert summary["float_layers"] >= 4 and "excluded" not in summary  # counted, not named
    assert json.loads(graph.metadata["quantization"]) == {k: v for k, v in summary.items() if k != "quality"}
    assert summary["float_layer_weights"]["weights"] == 3 and summary["float16_stored_slopes"] == 1
    weights = _weights_of(graph)
    assert sorted(weights) == sorted(WEIGHTS) and set(int8_stored_weights(graph.metadata)) == set(weights.values())
    for name in weights.values():  # int8 values times one scale per output channel, exactly
        assert int8_factors(graph.initializers[name], 0) is not None
    narrow = stored_weights(graph.metadata)
    slope = next(n.inputs[1] for n in graph.nodes if n.op_type == "PRelu")
    biases = [n.inputs[2] for n in graph.nodes if n.op_type in ("Conv", "Gemm")]
    assert all(narrow.get(name) == "float16" for name in [slope, *biases])
    for name in [slope, *biases]:
        value = graph.initializers[name]
        assert np.array_equal(value.astype(np.float16).astype(np.float32), value)
    with pytest.warns(QuantizationSpeedWarning, match="1 PRelu layers stay float"):
        plain = quantize(fp32, samples)  # a plain INT8 beside it: its PReLU stays float
    for backend in ("numpy", "onnxruntime"):
        weights_only_db = _sqnr(fp32, q, held_out, backend)
        assert weights_only_db > 35 and weights_only_db > _sqnr(fp32, plain, held_out, backend) + 6
    path, float_path = tmp_path / "w.eim", tmp_path / "f.eim"
    q.save(path)
    fp32.save(float_path)
    stored = size_breakdown(path).tensor_bytes
    assert stored["int8"] == sum(int(np.prod(s)) for s in WEIGHTS.values()) and stored.get("float32", 0) == 0
    assert path.stat().st_size < 0.4 * float_path.stat().st_size
    loaded = ei.load(path)
    for feeds in held_out[:2]:
        assert np.array_equal(ei.Session(loaded, backend="numpy").run(feeds)["y"],
                              ei.Session(q, backend="numpy").run(feeds)["y"])


def test_excluded_layers_keep_float32_weights(net):
    fp32, samples, held_out = net
    conv = next(n for n in fp32.graph.nodes if n.op_type == "Conv" and fp32.graph.initializers[n.inputs[1]].shape == WEIGHTS["w2"])
    q = quantize(fp32, samples, activations="float", exclude=[conv.name or conv.outputs[0]])
    assert json.loads(q.metadata["quantization"])["float32_weights"] == [conv.name or conv.outputs[0]]
    weights = _weights_of(q.graph)
    assert weights["w2"] not in int8_stored_weights(q.graph.metadata)
    assert np.array_equal(q.graph.initializers[weights["w2"]], fp32.graph.initializers[conv.inputs[1]])
    assert {weights["w1"], weights["w3"]} <= set(int8_stored_weights(q.graph.metadata))
    assert _sqnr(fp32, q, held_out, "numpy") > 35


@pytest.mark.parametrize("options, found", [
    ({"min_sqnr": 0.0}, "min_sqnr=0.0"), ({"bias_correction": True}, "bias_correction=True"),
    ({"mode": "dynamic"}, "mode='dynamic'"), ({"float_weights": "float32"}, "float_weights='float32'"),
    ({"quantize_outputs": True}, "quantize_outputs=True"), ({"reduce_range": True}, "reduce_range=True"),
    ({"per_channel": False}, "per_channel=False")])
def test_weight_only_int8_refuses_what_quantizes_activations(net, options, found):
    fp32, samples, _ = net
    with pytest.raises(InputError, match="activations='float' is weight-only static int8") as refused:
        quantize(fp32, samples, activations="float", **options)
    assert found in str(refused.value).split("; got ")[1]


def test_the_command_line_writes_weight_only_int8_and_says_so(net, tmp_path):
    from edgeinfer.cli.quantize import quantize_command

    fp32, samples, held_out = net
    source, calib, out = tmp_path / "net.eim", tmp_path / "calib", tmp_path / "net.w8.eim"
    fp32.save(source)
    calib.mkdir()
    for index, feeds in enumerate(samples[:16]):
        np.save(calib / f"{index}.npy", feeds["x"])
    result = CliRunner().invoke(quantize_command, [str(source), "--calib", str(calib), "--activations", "float",
                                                   "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "weight-only INT8: every layer computes in float" in result.output
    assert _sqnr(fp32, ei.load(out), held_out, "onnxruntime") > 35
    refused = CliRunner().invoke(quantize_command, [str(source), "--calib", str(calib), "--activations", "float",
                                                    "--min-sqnr", "30", "-o", str(tmp_path / "x.eim")])
    assert refused.exit_code != 0 and "activations='float'" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "x.eim").exists()
