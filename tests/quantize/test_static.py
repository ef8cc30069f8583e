import json

import numpy as np
import pytest
from helpers import ort_optimized_ops, reference_run, sqnr

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close, parse_model
from edgeinfer.errors import UnsupportedOpError
from edgeinfer.ir import Graph
from edgeinfer.model import Model
from edgeinfer.quantize.static import calibrate, quantize_static


@pytest.fixture(scope="module")
def cnn():
    proto = zoo.cnn_residual_depthwise()
    samples = [zoo.example_inputs(proto, seed=seed)["input"] for seed in range(1, 13)]
    fused = ei.convert(proto, optimize=2)
    return proto, fused, samples, calibrate(fused, samples)


@pytest.fixture(scope="module")
def int8(cnn):
    _, fused, _, calibration = cnn
    return quantize_static(fused, calibration, method="minmax")


def test_onnxruntime_runs_every_layer_with_int8_kernels(int8):
    ops = ort_optimized_ops(int8.graph)
    assert ops["QLinearConv"] == 5 and ops["QLinearAdd"] == 1 and ops["QGemm"] == 1
    assert ops["QLinearGlobalAveragePool"] == 1
    assert "Conv" not in ops and "DequantizeLinear" not in ops  # nothing fell back to float


def test_layout_mirrors_onnxruntime_qdq(int8):
    graph = int8.graph
    graph.verify()
    assert "Relu" not in graph.op_histogram() and "Clip" not in graph.op_histogram()  # absorbed by Q
    for node in graph.nodes:
        if node.op_type != "Conv":
            continue
        x_dq, w_dq, b_dq = (graph.producer(name) for name in node.inputs)
        assert w_dq.op_type == x_dq.op_type == b_dq.op_type == "DequantizeLinear"
        weight, w_scale = graph.values[w_dq.inputs[0]].const, graph.values[w_dq.inputs[1]].const
        assert weight.dtype == np.int8 and w_dq.attrs["axis"] == 0 and w_scale.shape == (weight.shape[0],)
        assert len(w_dq.inputs) == 2  # symmetric weights: the zero point 0 is not stored
        assert np.abs(weight).max() == 127  # symmetric: the largest weight of a channel maps to 127
        bias, b_scale = graph.values[b_dq.inputs[0]].const, graph.values[b_dq.inputs[1]].const
        x_scale = graph.values[x_dq.inputs[1]].const
        assert bias.dtype == np.int32 and len(b_dq.inputs) == 2  # zero point 0
        assert_close(b_scale, (x_scale * w_scale).astype(np.float32))
        assert graph.values[x_dq.inputs[0]].dtype == "uint8"
    assert graph.output_names == ["logits"]


def test_int8_model_tracks_fp32_on_every_backend(cnn, int8):
    proto, fused, _, _ = cnn
    feeds = zoo.example_inputs(proto, seed=99)
    reference = ei.Session(fused, backend="onnxruntime").run(feeds)["logits"]
    spec = reference_run(int8.graph, feeds)["logits"]  # onnx.reference: the QDQ semantics
    ort_out = ei.Session(int8, backend="onnxruntime").run(feeds)["logits"]
    numpy_out = ei.Session(int8, backend="numpy").run(feeds)["logits"]
    assert sqnr(reference, spec) > 25
    # the numpy backend follows the spec; onnxruntime's integer kernels requantize with a float
    # multiplier, so intermediate values may differ by a step: compare by signal to noise
    assert_close(numpy_out, spec, rtol=1e-4, atol=1e-4)  # float32 accumulation order differs
    assert sqnr(spec, ort_out) > 30


def test_fused_and_plain_graphs_quantize_to_the_same_model(cnn, int8):
    proto, _, samples, _ = cnn
    plain = ei.convert(proto, optimize=1)
    plain_int8 = quantize_static(plain, calibrate(plain, samples), method="minmax")
    feeds = zoo.example_inputs(proto, seed=5)
    assert_close(ei.Session(plain_int8, backend="numpy").run(feeds)["logits"],
                 ei.Session(int8, backend="numpy").run(feeds)["logits"])


@pytest.mark.parametrize("method", ["percentile", "entropy", "mse"])
def test_every_method_gives_a_usable_model(cnn, method):
    proto, fused, _, calibration = cnn
    model = quantize_static(fused, calibration, method=method)
    feeds = zoo.example_inputs(proto, seed=7)
    reference = ei.Session(fused, backend="onnxruntime").run(feeds)["logits"]
    assert sqnr(reference, ei.Session(model, backend="onnxruntime").run(feeds)["logits"]) > 20


def test_symmetric_int8_activations_keep_the_clamps(cnn):
    proto, fused, _, calibration = cnn
    model = quantize_static(fused, calibration, method="minmax", activations="int8")
    hist = model.graph.op_histogram()
    assert hist["Relu"] + hist["Clip"] >= 1
    zero_points = [model.graph.values[n.inputs[2]].const for n in model.graph.nodes if n.op_type == "QuantizeLinear"]
    assert all(z.dtype == np.int8 and not z.any() for z in zero_points)
    feeds = zoo.example_inputs(proto, seed=8)
    reference = ei.Session(fused, backend="onnxruntime").run(feeds)["logits"]
    assert sqnr(reference, ei.Session(model, backend="onnxruntime").run(feeds)["logits"]) > 20


@pytest.mark.parametrize("by", ["node", "output"])
def test_excluded_layer_stays_float(cnn, by):
    """A layer named by its node name or by its first output stays float (the output name was
    accepted and silently ignored: the layer was quantized)."""
    proto, fused, _, calibration = cnn
    first_conv = next(n for n in calibration.graph.nodes if n.op_type == "Conv")
    model = quantize_static(fused, calibration, exclude=[first_conv.name if by == "node" else first_conv.outputs[0]])
    assert json.loads(model.metadata["quantization"])["excluded"] == [first_conv.name]
    kept = next(n for n in model.graph.nodes if n.name == first_conv.name)
    assert model.graph.values[kept.inputs[1]].const.dtype == np.float32
    assert model.graph.producer(kept.inputs[1]) is None
    feeds = zoo.example_inputs(proto, seed=9)
    reference = ei.Session(fused, backend="onnxruntime").run(feeds)["logits"]
    assert sqnr(reference, ei.Session(model, backend="onnxruntime").run(feeds)["logits"]) > 20


OLD_OPSET = """
<ir_version: 7, opset_import: ["" : 11]>
net (float[1, 2, 6, 6] x) => (float[1, 4, 6, 6] y)
<float[4, 2, 3, 3] w = {WEIGHTS}, float[4] b = {0.1, -0.2, 0.3, 0.0}>
{
    c = Conv<pads = [1, 1, 1, 1]>(x, w, b)
    y = Relu(c)
}
"""


def test_per_channel_needs_opset_13_and_per_tensor_works_before(rng):
    weights = "{" + ",".join(f"{v:.5f}" for v in rng.standard_normal(72)) + "}"
    converted = ei.convert(parse_model(OLD_OPSET.replace("{WEIGHTS}", weights)), optimize=0).graph
    # the ONNX front end upgrades old opsets; a graph from elsewhere may still be at opset 11
    model = Model(Graph(converted.nodes, converted.inputs, converted.outputs, converted.initializers,
                        opset={"": 11}))
    samples = [rng.standard_normal((1, 2, 6, 6)).astype(np.float32) for _ in range(4)]
    calibration = calibrate(model, samples)
    with pytest.raises(UnsupportedOpError, match="opset >= 13"):
        quantize_static(model, calibration)
    per_tensor = quantize_static(model, calibration, per_channel=False, method="minmax")
    feeds = {"x": samples[0]}
    reference = ei.Session(model, backend="numpy").run(feeds)["y"]
    assert sqnr(reference, ei.Session(per_tensor, backend="numpy").run(feeds)["y"]) > 25
    assert isinstance(per_tensor, Model)


def test_zero_bias_is_dropped_and_bias_scales_are_stored_as_products(cnn, tmp_path):
    """A Conv whose bias is all zeros loses the bias (the same sums, nothing to store); every
    int32 bias's scale is declared as x_scale * w_scale, which the .eim stores as a product
    of the two (bit-identical on load) instead of its bytes."""
    from edgeinfer.format.sizes import size_breakdown
    from edgeinfer.ir.weights import weight_products

    _, fused, samples, _ = cnn
    graph = fused.graph
    conv = next(n for n in graph.nodes if n.op_type == "Conv" and len(n.inputs) == 3)
    initializers = dict(graph.initializers)
    initializers[conv.inputs[2]] = np.zeros_like(initializers[conv.inputs[2]])
    zero_bias = Model(graph.replace(graph.nodes, initializers=initializers), fused.metadata)
    int8 = quantize_static(zero_bias, calibrate(zero_bias, samples), method="minmax")
    q = int8.graph
    dropped = next(n for n in q.nodes if n.op_type == "Conv" and n.name == conv.name)
    assert len(dropped.inputs) == 2
    feeds = {"input": samples[0]}
    reference = ei.Session(zero_bias, backend="numpy").run(feeds)["logits"]
    got = ei.Session(int8, backend="numpy").run(feeds)["logits"]
    assert sqnr(reference, got) > 20

    products = weight_products(q.metadata)
    biases = [n for n in q.nodes if n.op_type == "DequantizeLinear" and q.values[n.inputs[0]].dtype == "int32"]
    assert biases and {n.inputs[1] for n in biases} == set(products)
    for name, (x, w) in products.items():
        want = np.multiply(q.initializers[x], q.initializers[w], dtype=np.float32)
        assert np.array_equal(q.initializers[name].view(np.uint32), want.view(np.uint32))
    path = tmp_path / "int8.eim"
    int8.save(path)
    assert size_breakdown(path).derived == len(products)
    loaded = ei.load(path)
    assert loaded.graph.content_hash() == q.content_hash()
    assert_close(ei.Session(loaded, backend="numpy").run(feeds)["logits"], got)


HEAD_THROUGH_TRANSPOSE = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[1, 2, 6, 6] x) => (float[1, 6, 6, 4] y, float[1, 144] z)
<float[4, 2, 3, 3] w = {WEIGHTS}, float[4] b = {0.1, -0.2, 0.3, 0.0}, int64[2] flat = {1, 144}>
{
    c = Conv<pads = [1, 1, 1, 1]>(x, w, b)
    y = Transpose<perm = [0, 2, 3, 1]>(c)
    r = Relu(c)
    z = Reshape(r, flat)
}
"""


def test_an_output_reached_through_data_movement_stays_float(rng):
    """The op writing a graph output through a Transpose or Reshape (a converted NHWC model's
    last Conv) keeps a float result: quantized, a value outside every calibration sample's range
    is clipped (a face score negative on all calibration photos read 0 on a held-out face)."""
    weights = "{" + ",".join(f"{v:.5f}" for v in rng.standard_normal(72)) + "}"
    model = ei.convert(parse_model(HEAD_THROUGH_TRANSPOSE.replace("{WEIGHTS}", weights)), optimize=0)
    samples = [rng.standard_normal((1, 2, 6, 6)).astype(np.float32) for _ in range(8)]
    int8 = quantize_static(model, calibrate(model, samples), method="minmax")
    q = int8.graph
    quantized = {n.inputs[0] for n in q.nodes if n.op_type == "QuantizeLinear"}
    assert "x" in quantized and not quantized & {"c", "r", "y", "z"}
    assert q.producer("y").op_type == "Transpose" and q.producer("z").op_type == "Reshape"
    feeds = {"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)}
    reference = ei.Session(model, backend="numpy").run(feeds)
    got = ei.Session(int8, backend="numpy").run(feeds)
    assert sqnr(reference["y"], got["y"]) > 25 and sqnr(reference["z"], got["z"]) > 25


CONCAT_OF_CONVS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) <float[4, 3, 3, 3] wa = {WA}, float[6, 3, 1, 1] wb = {WB},
                                                 float[4, 10, 1, 1] wc = {WC}> {
    a = Conv <pads = [1, 1, 1, 1]> (x, wa)
    r = Relu (a)
    b = Conv (x, wb)
    c = Concat <axis = 1> (r, b)
    y = Conv (c, wc)
}
"""


def test_a_concats_inputs_are_rounded_once_to_its_own_grid(rng):
    """The inputs of a quantized Concat that only it reads take its output's parameters: each
    value is rounded once, to the grid the Concat's output rounds it to anyway (before: to its
    producer's grid, then again to the Concat's), and the Concat copies 8-bit data."""
    from edgeinfer.quantize.calibrate import observing_graph
    from edgeinfer.quantize.qdq import QuantPlan

    def values(count: int) -> str:
        return "{" + ",".join(f"{v:.5f}" for v in rng.standard_normal(count)) + "}"

    text = CONCAT_OF_CONVS.replace("{WA}", values(108)).replace("{WB}", values(18)).replace("{WC}", values(40))
    model = ei.convert(parse_model(text), optimize=0)
    calibration = calibrate(model, [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 2 for _ in range(8)])
    shared = quantize_static(model, calibration, method="minmax")
    original = QuantPlan.share_concat_inputs
    try:
        QuantPlan.share_concat_inputs = lambda self, node: None
        separate = quantize_static(model, calibration, method="minmax")
    finally:
        QuantPlan.share_concat_inputs = original
    q = shared.graph

    def params(graph, tensor):
        node = next(n for n in graph.nodes if n.op_type == "QuantizeLinear" and n.inputs[0] == tensor)
        return tuple(float(graph.initializers[name]) for name in node.inputs[1:3])

    # b takes the Concat's parameters; r (conv a with its Relu folded) keeps its own range, whose
    # 0 at the bottom performs the Relu
    assert params(q, "b") == params(q, "c") != params(q, "r") == params(separate.graph, "r")
    assert params(q, "r")[1] == 0 and params(separate.graph, "b") != params(separate.graph, "c")
    scale, zero_point = params(q, "c")
    feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 2} for _ in range(4)]
    errors = {}
    for label, model_q in (("shared", shared), ("separate", separate)):
        raw = [n.outputs[0] for n in model_q.graph.nodes if n.op_type == "Conv"][:2]  # the float conv results
        concat = next(n for n in model_q.graph.nodes if n.op_type == "Concat")
        observed = ei.Session(ei.Model(observing_graph(model_q.graph, raw + list(concat.outputs))), backend="numpy")
        worst = 0.0
        for feed in feeds:
            out = observed.run(feed)
            worst = max(worst, float(np.abs(out[concat.outputs[0]][:, 4:] - out[raw[1]]).max()))  # b's channels
        errors[label] = worst / scale
    # b rounded once: within half a step of the Concat's grid (its range covers b's: no clip);
    # separately, b was rounded to its own grid first and clipped to its own narrower range
    # (measured 22 steps off on these held-out inputs)
    assert errors["shared"] <= 0.5 + 1e-4 < errors["separate"], errors
    reference = np.concatenate([ei.Session(model, backend="numpy").run(f)["y"] for f in feeds])
    got = {label: np.concatenate([ei.Session(m, backend=backend).run(f)["y"] for f in feeds])
           for label, m, backend in (("shared", shared, "numpy"), ("separate", separate, "numpy"), ("ort", shared, "onnxruntime"))}
    assert sqnr(reference, got["shared"]) >= sqnr(reference, got["separate"]) - 0.5
    np.testing.assert_allclose(got["ort"], got["shared"], atol=0.05 * float(np.abs(reference).max()))


def _stored_entries(path) -> dict[str, dict]:
    """``{initializer name: its tensor table entry}`` of the saved top graph of ``path``."""
    from edgeinfer.format.eim import document_bytes, parse_document, read_header

    raw = path.read_bytes()
    header = read_header(raw, str(path))
    document = parse_document(document_bytes(raw, header, str(path)), header, str(path))
    return {item["name"]: document["tensors"][item["tensor"]] for item in document["graph"]["initializers"]}


def test_weight_scales_lie_on_the_float16_grid_and_the_file_stores_scales_and_biases_narrow(cnn, int8, tmp_path):
    """Weight scales are rounded up onto the float16 grid (a step at most 2**-11 coarser, so no
    weight clips); the .eim then stores them, and the int32 biases that fit int16, in 2 bytes."""
    from edgeinfer.ir.weights import weight_products

    _, fused, samples, _ = cnn
    q = int8.graph
    weights = [n for n in q.nodes if n.op_type == "DequantizeLinear" and q.values[n.inputs[0]].dtype == "int8"
               and q.values[n.inputs[0]].const is not None]
    assert len(weights) >= 5
    for node in weights:
        codes, scale = q.initializers[node.inputs[0]], q.initializers[node.inputs[1]]
        assert np.array_equal(scale.astype(np.float16).astype(np.float32), scale)
        assert np.abs(codes).max() == 127  # the largest weight still takes the extreme code
    path = tmp_path / "int8.eim"
    int8.save(path)
    entries = _stored_entries(path)
    operands = {name for pair in weight_products(q.metadata).values() for name in pair}
    scales = [n.inputs[1] for n in weights if q.initializers[n.inputs[1]].size >= 4]  # with a bias or not
    assert any(name in operands for name in scales)
    assert scales and all(entries[name].get("stored") == "float16" for name in scales)
    biases = [name for name, a in q.initializers.items() if a.dtype == np.int32 and a.size >= 4]
    fits = [name for name in biases if np.abs(q.initializers[name]).max() < 2**15]
    assert fits and all(entries[name].get("stored") in ("int8", "int16") for name in fits)
    assert all("stored" not in entries[name] for name in set(biases) - set(fits))
    loaded = ei.load(path)
    assert loaded.graph.content_hash() == q.content_hash()
    feeds = {"input": samples[0]}
    assert_close(ei.Session(loaded, backend="numpy").run(feeds)["logits"], ei.Session(int8, backend="numpy").run(feeds)["logits"])
    float_out = ei.Session(fused, backend="numpy").run(feeds)["logits"]
    assert sqnr(float_out, ei.Session(loaded, backend="onnxruntime").run(feeds)["logits"]) > 20


def test_float_layers_store_float16_biases_at_no_measurable_cost(cnn, tmp_path, monkeypatch):
    """With ``float_weights="int8"`` the biases of the layers kept float are float16 values,
    declared so (2 bytes each in the file): their output stays within 60 dB of float32 biases."""
    import sys

    from edgeinfer.ir.weights import stored_weights
    from edgeinfer.quantize.static import quantizable_layers

    _, fused, samples, calibration = cnn
    layers = quantizable_layers(calibration)
    mixed = quantize_static(fused, calibration, exclude=layers, float_weights="int8")
    biases = {n.inputs[2] for n in mixed.graph.nodes if n.op_type in ("Conv", "Gemm") and len(n.inputs) > 2}
    assert biases and biases <= set(stored_weights(mixed.graph.metadata))
    for name in biases:
        value = mixed.graph.initializers[name]
        assert value.dtype == np.float32 and np.array_equal(value.astype(np.float16).astype(np.float32), value)
    assert json.loads(mixed.metadata["quantization"])["float16_stored_biases"] == len(biases)
    static = sys.modules["edgeinfer.quantize.static"]
    monkeypatch.setattr(static, "float16_float_biases", lambda graph, layers: (graph, []))
    wide = quantize_static(fused, calibration, exclude=layers, float_weights="int8")
    assert not biases & set(stored_weights(wide.graph.metadata))
    for label, model in (("f16", mixed), ("f32", wide)):
        model.save(tmp_path / f"{label}.eim")
    saved = (tmp_path / "f32.eim").stat().st_size - (tmp_path / "f16.eim").stat().st_size
    assert saved >= 2 * sum(mixed.graph.initializers[name].size for name in biases) - 64
    for seed in range(3):
        feeds = {"input": samples[seed]}
        narrow = ei.Session(ei.load(tmp_path / "f16.eim"), backend="numpy").run(feeds)["logits"]
        assert sqnr(ei.Session(wide, backend="numpy").run(feeds)["logits"], narrow) > 60
        assert sqnr(ei.Session(fused, backend="numpy").run(feeds)["logits"], narrow) > 30
