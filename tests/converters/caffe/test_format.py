"""Reading Caffe files: net declarations, net-state filtering, in-place blobs, weights
without a schema copy, and the errors bad files raise."""

from __future__ import annotations

import re
import struct
import tracemalloc

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.converters import caffe
from edgeinfer.converters.caffe import read_caffemodel, write_caffemodel
from edgeinfer.errors import EdgeInferError, ModelFormatError, UnsupportedOpError

SMALL = """
name: "small"
input: "data"
input_shape { dim: 1 dim: 2 dim: 5 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 3 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 4 } }
"""


def test_accepts_prototxt_paths_only():
    assert caffe.accepts("deploy.prototxt") and caffe.accepts("DEPLOY.PROTOTXT")
    assert not caffe.accepts("net.caffemodel") and not caffe.accepts("model.onnx") and not caffe.accepts(object())
    assert {"Convolution", "Pooling", "PriorBox", "Input"} <= set(caffe.supported_layers())


@pytest.mark.parametrize("declaration", [
    'input: "data"\ninput_shape { dim: 1 dim: 2 dim: 5 dim: 5 }',
    'input: "data"\ninput_dim: 1 input_dim: 2 input_dim: 5 input_dim: 5',
    'layer { name: "input" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 5 dim: 5 } } }',
])
def test_input_declarations(harness, declaration):
    body = SMALL.split("\n", 4)[4]
    prototxt, caffemodel = harness.write(f'name: "small"\n{declaration}\n{body}', "decl")
    model = harness.convert(prototxt, caffemodel)
    assert [(t.name, t.shape) for t in model.inputs] == [("data", (1, 2, 5, 5))]


def test_input_shapes_option_sizes_an_undeclared_input(harness):
    body = SMALL.split("\n", 4)[4]
    prototxt, _ = harness.write(f'name: "small"\ninput: "data"\n{body}', "undeclared", weights=False)
    with pytest.raises(ModelFormatError, match="input 'data' has no shape"):
        harness.convert(prototxt, None)
    model = harness.convert(prototxt, None, input_shapes={"data": (3, 2, 6, 6)})
    assert model.inputs[0].shape == (3, 2, 6, 6) and model.outputs[0].shape == (3, 4)


def test_dynamic_batch_refuses_layers_that_cut_the_batch_axis(harness):
    text = SMALL + 'layer { name: "sl" type: "Slice" bottom: "ip" top: "a" top: "b" slice_param { axis: 0 } }\n'
    prototxt, _ = harness.write(text.replace("dim: 1 dim: 2", "dim: 2 dim: 2"), "batchcut", weights=False)
    assert harness.convert(prototxt, None).outputs[0].shape == (1, 4)
    with pytest.raises(UnsupportedOpError, match=r"layer 'sl' \(Slice\).*batch axis.*dynamic_batch"):
        harness.convert(prototxt, None, dynamic_batch=True)


def test_in_place_layers_keep_blob_names(harness):
    text = SMALL + 'layer { name: "sig" type: "Sigmoid" bottom: "ip" top: "ip" }\n'
    model = harness.compare(text, "inplace", outputs=["conv", "ip"])
    assert [t.name for t in model.outputs] == ["conv", "ip"]  # the latest version owns the name
    graph = model.graph
    assert graph.producer("ip").op_type == "Sigmoid"
    assert graph.producer("conv").op_type == "Relu"


def test_test_phase_filtering(harness):
    text = SMALL + """
layer { name: "train_only" type: "Power" bottom: "ip" top: "ip" power_param { scale: 100 } include { phase: TRAIN } }
layer { name: "test_only" type: "Power" bottom: "ip" top: "ip" power_param { scale: 2 } include { phase: TEST } }
layer { name: "not_in_test" type: "Power" bottom: "ip" top: "ip" power_param { scale: 7 } exclude { phase: TEST } }
layer { name: "staged" type: "Power" bottom: "ip" top: "ip" power_param { shift: 1 } include { stage: "deploy" } }
"""
    prototxt, caffemodel = harness.write(text, "phase")
    base = harness.convert(prototxt, caffemodel, outputs=["conv"])
    feeds = harness.feeds(base)
    test = harness.run(harness.convert(prototxt, caffemodel), feeds)["ip"]
    staged = harness.run(harness.convert(prototxt, caffemodel, stages=["deploy"]), feeds)["ip"]
    train = harness.run(harness.convert(prototxt, caffemodel, phase="TRAIN"), feeds)["ip"]
    assert_close(staged, test + 1, rtol=1e-6, atol=1e-6)
    assert_close(train, test / 2 * 100 * 7, rtol=1e-5, atol=1e-5)


def test_prototxt_without_weights_warns_and_runs(harness):
    prototxt, _ = harness.write(SMALL, "noweights", weights=False)
    with pytest.warns(caffe.RandomWeightsWarning, match="no weights"):
        model = ei.convert(prototxt)
    result = harness.run(model, harness.feeds(model))
    assert result["ip"].shape == (1, 4) and np.isfinite(result["ip"]).all()


def test_unknown_layer_names_layer_and_type(harness):
    text = SMALL + 'layer { name: "roi" type: "ROIPooling" bottom: "ip" top: "roi" }\n'
    prototxt, _ = harness.write(text, "unknown", weights=False)
    with pytest.raises(UnsupportedOpError, match=r"layer 'roi' \(ROIPooling\).*'ROIPooling' is not supported"):
        harness.convert(prototxt, None)


def test_training_layers_point_to_the_deploy_net(harness):
    text = SMALL + ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "data" top: "loss" '
                    'include { phase: TEST } }\n')
    prototxt, _ = harness.write(text, "trainval", weights=False)
    with pytest.raises(UnsupportedOpError, match=r"layer 'loss' \(SoftmaxWithLoss\).*deploy prototxt"):
        harness.convert(prototxt, None)


def test_unknown_fields_warn_and_are_skipped(harness):
    text = SMALL + 'layer { name: "x" type: "Power" bottom: "ip" top: "x" some_fork_param { knob: 3 } }\n'
    prototxt, _ = harness.write(text, "fork", weights=False)
    with pytest.warns(caffe.UnknownFieldWarning, match="some_fork_param"):
        harness.convert(prototxt, None)


@pytest.mark.parametrize("text, message", [
    ('name: "x"\nlayer { name: "a" type: "ReLU" bottom: "data" top: "a" ', "cannot parse"),
    ('name: "x"\ninput: "data"\ninput_dim: 1 input_dim: 2\n', "4 input_dim values"),
    ('name: "x"\ninput: "data"\ninput_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3\n'
     'layer { name: "a" type: "ReLU" bottom: "missing" top: "a" }', "blob\\(s\\) \\['missing'\\]"),
    ('name: "x"\ninput: "data"\ninput_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3\n'
     'layer { name: "a" type: "ReLU" bottom: "data" top: "a" }\nlayer { name: "a" type: "ReLU" bottom: "a" top: "b" }',
     "used twice"),
    ('name: "x"\ninput: "data"\ninput_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3\n'
     'layer { name: "a" type: "ReLU" bottom: "data" top: "a" }\nlayers { name: "b" type: RELU bottom: "a" top: "b" }',
     "mixes V2"),
    ('name: "x"\ninput: "data"\ninput_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3\n'
     'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MAX } }', "kernel_size"),
])
def test_malformed_prototxt_raises_model_format_error(harness, text, message):
    prototxt, _ = harness.write(text, "bad", weights=False)
    with pytest.raises(ModelFormatError, match=message) as info:
        harness.convert(prototxt, None)
    assert "bad.prototxt" in str(info.value)


def test_missing_files(tmp_path, harness):
    with pytest.raises(ModelFormatError, match="no such file"):
        caffe.convert(tmp_path / "absent.prototxt")
    prototxt, _ = harness.write(SMALL, "small", weights=False)
    with pytest.raises(ModelFormatError, match="cannot open"):
        harness.convert(prototxt, tmp_path / "absent.caffemodel")
    empty = tmp_path / "empty.caffemodel"
    empty.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="empty file"):
        harness.convert(prototxt, empty)
    with pytest.raises(ModelFormatError, match="no layers|invalid field key|truncated"):
        harness.convert(prototxt, prototxt)  # a prototxt given as weights


@pytest.mark.parametrize("cut", [1, 7, 100, 300])
def test_truncated_caffemodel_names_file_and_layer(harness, cut):
    prototxt, caffemodel = harness.write(SMALL, "trunc")
    data = caffemodel.read_bytes()
    truncated = harness.folder / "truncated.caffemodel"
    truncated.write_bytes(data[:-cut])
    with pytest.raises(ModelFormatError, match=r"truncated\.caffemodel.*(layer 'ip'|truncated or corrupt)") as info:
        harness.convert(prototxt, truncated)
    assert "byte" in str(info.value)


def test_blob_shape_mismatch_and_missing_blobs(harness, tmp_path):
    prototxt, _ = harness.write(SMALL, "mismatch", weights=False)
    rng = np.random.default_rng(0)
    wrong = tmp_path / "wrong.caffemodel"
    write_caffemodel(wrong, [("conv", "Convolution", [rng.standard_normal((3, 2, 2, 2)), rng.standard_normal(3)]),
                             ("ip", "InnerProduct", [rng.standard_normal((4, 27)), rng.standard_normal(4)])])
    with pytest.raises(ModelFormatError, match=r"wrong\.caffemodel: layer 'conv' \(Convolution\): blob 0 has shape "
                                               r"\[3, 2, 2, 2\], expected \[3, 2, 3, 3\]"):
        harness.convert(prototxt, wrong)
    missing = tmp_path / "missing.caffemodel"
    write_caffemodel(missing, [("conv", "Convolution", [rng.standard_normal((3, 2, 3, 3))])])
    with pytest.raises(ModelFormatError, match=r"layer 'conv' \(Convolution\): expected 2 blob\(s\), found 1"):
        harness.convert(prototxt, missing)
    absent = tmp_path / "absent_layer.caffemodel"
    write_caffemodel(absent, [("conv", "Convolution", [rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3)])])
    with pytest.raises(ModelFormatError, match="layer 'ip'.*no layer of this name"):
        harness.convert(prototxt, absent)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_reader_decodes_unpacked_double_and_legacy_blobs(tmp_path):
    values = np.arange(6, dtype=np.float32) - 2.5
    unpacked = b"".join(_varint(5 << 3 | 5) + struct.pack("<f", v) for v in values)
    legacy_dims = _varint(1 << 3) + _varint(1) + _varint(2 << 3) + _varint(1) + _varint(3 << 3) + _varint(2) \
        + _varint(4 << 3) + _varint(3)
    doubles = _field(8, struct.pack("<4d", 1.5, -2.0, 3.25, 0.0)) + _field(7, _field(1, bytes([2, 2])))
    layer = (_field(1, b"w") + _field(2, b"Convolution") + _field(7, legacy_dims + unpacked) + _field(7, doubles)
             + _varint(10 << 3) + _varint(1))  # a field the reader skips
    path = tmp_path / "handmade.caffemodel"
    path.write_bytes(_field(1, b"net") + _field(100, layer))
    weights = read_caffemodel(path)["w"]
    assert weights.type == "Convolution" and weights.legacy == [True, False]
    assert_close(weights.blobs[0], values.reshape(1, 1, 2, 3))
    assert_close(weights.blobs[1], np.array([[1.5, -2.0], [3.25, 0.0]], np.float32))


def test_reader_holds_about_one_copy_of_the_weights(tmp_path):
    big = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)  # 16 MiB
    path = tmp_path / "big.caffemodel"
    write_caffemodel(path, [("fc", "InnerProduct", [big, np.zeros(1024, np.float32)])])
    tracemalloc.start()
    try:
        weights = read_caffemodel(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_close(weights["fc"].blobs[0], big, rtol=0, atol=0)
    assert peak < 1.25 * big.nbytes, f"peak {peak / 2**20:.1f} MiB for {big.nbytes / 2**20:.0f} MiB of weights"


def test_schema_field_numbers_agree_with_opencv():
    """OpenCV's DNN module embeds its own caffe.proto descriptor: every field both schemas
    define must have the same number, type and label, except where forks really differ."""
    import cv2
    from google.protobuf import descriptor_pb2

    from edgeinfer.converters.caffe.schema import CAFFE_PROTO, _compile

    binary = next(p for p in __import__("pathlib").Path(cv2.__file__).parent.glob("cv2*.so"))
    data = binary.read_bytes()
    start = data.find(b"\n\x12opencv-caffe.proto")
    if start < 0:
        pytest.skip("this OpenCV build does not embed its caffe.proto descriptor")
    theirs = _embedded_descriptor(data, start, descriptor_pb2)
    ours = _compile(CAFFE_PROTO)
    # Fork-specific numbers: SSD's caffe numbers PermuteParameter etc. 202-206, OpenCV 147-150;
    # BVLC's round_mode took number 13 where OpenCV put ceil_mode.
    divergent = {("LayerParameter", "permute_param"), ("LayerParameter", "prior_box_param"),
                 ("LayerParameter", "norm_param"), ("LayerParameter", "detection_output_param"),
                 ("PoolingParameter", "ceil_mode")}
    by_name = {m.name: {f.name: f for f in m.field} for m in theirs.message_type}
    compared = 0
    for message in ours.message_type:
        for field in message.field:
            other = by_name.get(message.name, {}).get(field.name)
            if other is None or (message.name, field.name) in divergent:
                continue
            compared += 1
            assert (field.number, field.type, field.label) == (other.number, other.type, other.label), \
                f"{message.name}.{field.name}"
    assert compared > 250


def _embedded_descriptor(data: bytes, start: int, descriptor_pb2):
    """Walk the top-level fields of a serialized FileDescriptorProto until they stop making sense."""
    pos = start
    while True:
        key, after = _read_varint(data, pos)
        if key >> 3 not in range(1, 15) or key & 7 not in (0, 2):
            break
        value, after = _read_varint(data, after)
        pos = after + (value if key & 7 == 2 else 0)
    return descriptor_pb2.FileDescriptorProto.FromString(data[start:pos])


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


def test_errors_are_edgeinfer_errors_with_one_line_messages(harness):
    prototxt, _ = harness.write('name: "x"\nlayer {', "oneline", weights=False)
    with pytest.raises(EdgeInferError) as info:
        harness.convert(prototxt, None)
    assert re.search(r"oneline\.prototxt: expected a Caffe prototxt", str(info.value))
