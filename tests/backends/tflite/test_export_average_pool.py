"""AveragePool with explicit pads and count_include_pad=0 (issue 40). Where the pads are what
TFLite's SAME padding pads, AVERAGE_POOL_2D SAME leaves them out of the count itself; other
pads become PAD (zeros), a VALID pool and a MUL by ``kernel area / real elements`` of each
window. Each graph runs in onnxruntime (the reference), on edgeinfer's numpy backend and, as
an exported .tflite, in LiteRT; onnx's light ShuffleNet and Inception v1 pool so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.format.tflite import export_tflite

from .conftest import opcodes, run_flatbuffer

ort = pytest.importorskip("onnxruntime")

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
SAME = ("AVERAGE_POOL_2D",)  # the pool alone
COUNT_MAP = ("PAD", "AVERAGE_POOL_2D", "MUL")
INCLUDED = ("PAD", "AVERAGE_POOL_2D")

CASES = {  # name -> (input shape, AveragePool attributes, the operators between the layout TRANSPOSEs)
    "same_symmetric": ((1, 3, 7, 7), "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]", SAME),
    "same_pad_after": ((1, 3, 6, 6), "kernel_shape = [3, 3], strides = [2, 2], pads = [0, 0, 1, 1]", SAME),
    "shufflenet_pads": ((2, 3, 8, 8), "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]", COUNT_MAP),
    "inception_pads": ((1, 4, 7, 7), "kernel_shape = [7, 7], pads = [0, 0, 1, 1]", COUNT_MAP),
    "rows_only": ((1, 2, 6, 5), "kernel_shape = [3, 2], pads = [2, 0, 1, 0]", COUNT_MAP),
    "same_lower": ((1, 2, 6, 6), 'kernel_shape = [2, 2], auto_pad = "SAME_LOWER"', COUNT_MAP),
    # count_include_pad=1 was exported so before; a guard that the count map stays out of it
    "pads_counted": ((1, 3, 8, 8), "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], "
                                   "count_include_pad = 1", INCLUDED),
}


def _typed(text: str) -> onnx.ModelProto:
    """The model of ``text`` with its output's shape (declared as a scalar) from ONNX inference."""
    model = parse_model(text)
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _pool_model(shape: tuple[int, ...], attrs: str) -> onnx.ModelProto:
    dims = ", ".join(map(str, shape))
    return _typed(f"{HEADER}\nt (float[{dims}] x) => (float y)\n{{\n y = AveragePool <{attrs}> (x)\n}}")


def _onnx_model(name: str) -> onnx.ModelProto:
    shape, attrs, _ = CASES[name]
    return _pool_model(shape, attrs)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("resolver", ["builtin", "xnnpack"])
def test_average_pool_matches_onnxruntime(name, resolver):
    onnx_model = _onnx_model(name)
    x = np.random.default_rng(0).standard_normal(CASES[name][0]).astype(np.float32)
    session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    (reference,) = session.run(None, {"x": x})
    model = ei.convert(onnx_model, optimize=0)
    (numpy_out,) = ei.Session(model).run({"x": x}).values()
    assert_close(numpy_out, reference)

    data = export_tflite(model.graph)
    assert [op for op in opcodes(data) if op != "TRANSPOSE"] == list(CASES[name][2])
    (got,) = run_flatbuffer(data, {"x": x}, resolver)
    assert_close(got, reference)


def test_padding_only_windows_are_refused():
    """Pads as large as the kernel leave windows over padding alone (ONNX: 0 / 0)."""
    model = ei.convert(_pool_model((1, 1, 4, 4), "kernel_shape = [2, 2], pads = [2, 0, 0, 0]"), optimize=0)
    with pytest.raises(ei.UnsupportedOpError, match=r"pads \[2, 0, 0, 0\] leave a window .* no input element"):
        export_tflite(model.graph)


def test_int8_pool_with_count_map_runs_float_between_quantized_tensors():
    """The integer pool has no count map: such a pool of a QDQ model runs in float32 between
    a DEQUANTIZE and a QUANTIZE, one int8 step from the numpy backend."""
    text = (f"{HEADER}\nt (float[1, 3, 8, 8] x) => (float y)\n<float s = {{0.05}}, int8 z = {{0}}>\n{{\n"
            " q = QuantizeLinear (x, s, z)\n d = DequantizeLinear (q, s, z)\n"
            " p = AveragePool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (d)\n"
            " pq = QuantizeLinear (p, s, z)\n y = DequantizeLinear (pq, s, z)\n}")
    model = ei.convert(_typed(text), optimize=0)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (expected,) = ei.Session(model).run({"x": x}).values()
    data = export_tflite(model.graph)
    assert "MUL" in opcodes(data) and "DEQUANTIZE" in opcodes(data)
    (got,) = run_flatbuffer(data, {"x": x})
    assert_close(got, expected, atol=0.05 * 1.01, rtol=0)  # one int8 step of scale 0.05


LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("name", ["light_shufflenet", "light_inception_v1"])
def test_light_model_exports_and_matches_onnxruntime(name, tmp_path):
    """The models' weights are constants of 0.02, so their softmax output is uniform whatever
    the input; the AveragePool outputs, made graph outputs, carry what the pools compute."""
    path = LIGHT / f"{name}.onnx"
    if not path.is_file():
        pytest.skip(f"the installed onnx has no {path}")
    onnx_model = onnx.shape_inference.infer_shapes(onnx.load(path), data_prop=True)
    pools = [node.output[0] for node in onnx_model.graph.node if node.op_type == "AveragePool"]
    onnx_model.graph.output.extend(v for v in onnx_model.graph.value_info if v.name in pools)
    source = tmp_path / f"{name}.onnx"
    onnx.save(onnx_model, source)
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal(feed.shape).astype(np.float32)
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, {feed.name: x}), strict=True))

    model = ei.convert(source)
    exported = tmp_path / f"{name}.tflite"
    ei.export(model, exported)
    data = exported.read_bytes()
    assert "MUL" in opcodes(data)  # at least one pool took the count-map path
    outputs = run_flatbuffer(data, {model.inputs[0].name: x}, "xnnpack")
    assert len(outputs) == len(model.outputs) == 1 + len(pools)
    for value, got in zip(model.outputs, outputs, strict=True):
        # float32 sums of convolutions in another order: rounding of the values' scale
        assert_close(got, reference[value.name], scaled_atol=1e-5, name=f"{name}:{value.name}")
