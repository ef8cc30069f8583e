"""Version 3.2 narrow storage: a small tensor whose every value a narrower dtype holds bit for bit
(an int32 bias within int16, int64 shape constants; a float32 product operand or scale of a
quantization op on the float16 grid, as the quantizer's weight scales are) is stored in it (``{"stored": ...}``) and widened on
load; anything else keeps its bytes."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.errors import ModelFormatError
from edgeinfer.format.eim import NARROW_MAX_BYTES, narrowed
from edgeinfer.format.sizes import size_breakdown
from edgeinfer.ir.weights import with_weight_products


def _arrays(rng) -> dict[str, np.ndarray]:
    on_grid = np.abs(rng.standard_normal(64)).astype(np.float16).astype(np.float32)
    on_grid[:3] = (0.0, np.inf, 2.0**-24)  # zero, infinity, float16's smallest subnormal
    x_scale = np.float32(0.0123)
    return {
        "bias16": rng.integers(-30000, 30000, 48).astype(np.int32),
        "bias8": rng.integers(-128, 128, 16).astype(np.int32),
        "shape": np.array([1, -1, 256, 7], np.int64),
        "w_scale": on_grid,  # an operand of the product b_scale: stored narrow
        "x_scale": np.array(x_scale, np.float32),
        "b_scale": np.multiply(x_scale, on_grid, dtype=np.float32),
        # no narrower storage for these: they keep their bytes
        "bias32": np.concatenate([rng.integers(-30000, 30000, 15), [40000]]).astype(np.int32),
        "float_on_grid": on_grid * 2,  # a float32 tensor that is no product operand (a weight)
        "nan_payload": np.array([0x3F800000, 0x7FC00001, 0x40000000, 0x40400000], np.uint32).view(np.float32),
        "tiny_ints": np.array([5, 6], np.int32),  # saves 6 bytes: under NARROW_MIN_SAVING
        "large_ints": np.ones(NARROW_MAX_BYTES // 4 + 1, np.int32),  # stays a view into the map
    }


STORED = {"bias16": "int16", "bias8": "int8", "shape": "int16", "w_scale": "float16"}


def test_exact_narrow_tensors_are_stored_narrow_and_read_back_bit_identical(tmp_path, rng, identity_graph, eim_file):
    arrays = _arrays(rng)
    graph = identity_graph(arrays)
    graph.metadata = with_weight_products(graph.metadata, {"b_scale": ("x_scale", "w_scale")})
    model = ei.Model(graph)
    path = tmp_path / "narrow.eim"
    model.save(path)
    parsed = eim_file.read(path)
    assert (parsed.major, parsed.minor) == (3, 2) and parsed.document["version"] == [3, 2]
    refs = {item["name"]: item["tensor"] for item in parsed.document["graph"]["initializers"]}
    entries = {name: parsed.document["tensors"][index] for name, index in refs.items()}
    assert {name: entry["stored"] for name, entry in entries.items() if "stored" in entry} == STORED
    assert entries["b_scale"]["product"] == [refs["x_scale"], refs["w_scale"]]
    for name, stored in STORED.items():
        assert entries[name]["dtype"] == str(arrays[name].dtype)
        assert entries[name]["nbytes"] == arrays[name].size * np.dtype(stored).itemsize
    breakdown = size_breakdown(path)  # counts the bytes as stored
    assert {name: breakdown.initializer_bytes[name] for name in STORED} == {
        name: arrays[name].size * np.dtype(kind).itemsize for name, kind in STORED.items()}
    assert breakdown.initializer_bytes["b_scale"] == 0 and breakdown.tensor_bytes["float16"] == 64 * 2
    loaded = ei.load(path)
    assert loaded.graph.content_hash() == model.graph.content_hash()
    for name, want in arrays.items():
        got = loaded.graph.initializers[name]
        assert got.dtype == want.dtype and got.shape == want.shape and not got.flags.writeable
        assert np.array_equal(np.atleast_1d(got).view(np.uint8), np.atleast_1d(want).view(np.uint8)), name  # bits
    out = ei.Session(loaded, backend="numpy").run({})
    assert np.array_equal(out["bias16_out"], arrays["bias16"]) and np.isinf(out["w_scale_out"][1])
    assert np.array_equal(out["b_scale_out"].view(np.uint32), arrays["b_scale"].view(np.uint32))
    saved_bytes = sum(arrays[name].nbytes - arrays[name].size * np.dtype(kind).itemsize for name, kind in STORED.items())
    whole = sum(a.nbytes for name, a in arrays.items() if name != "b_scale")
    assert parsed.data_length <= whole - saved_bytes + 64 * len(arrays)


def test_narrowed_is_exact_or_returns_the_array_itself(rng):
    for _ in range(50):
        kind = rng.integers(3)
        if kind == 0:
            a = rng.integers(-2**20, 2**20, 64) >> rng.integers(0, 21)
            a = a.astype(np.int64 if rng.integers(2) else np.int32)
        else:
            a = (rng.standard_normal(64) * 10.0 ** rng.integers(-8, 6)).astype(np.float32)
            if kind == 1:
                a = a.astype(np.float16).astype(np.float32)
        narrow = narrowed(a)
        if narrow is a:
            continue
        assert narrow.dtype.itemsize < a.dtype.itemsize
        assert np.array_equal(narrow.astype(a.dtype).view(np.uint8), a.view(np.uint8))
    assert narrowed(np.array([1, 2], np.int32)).dtype == np.int32  # saves 6 bytes: under NARROW_MIN_SAVING
    assert narrowed(np.arange(8, dtype=np.int32) + 2**15).dtype == np.int32
    assert narrowed(np.arange(8, dtype=np.int64) + 2**31).dtype == np.int64
    assert narrowed(np.arange(8, dtype=np.int64) + 2**15).dtype == np.int32
    assert narrowed(np.arange(8, dtype=np.uint8)).dtype == np.uint8  # no narrower storage for uint8


def test_the_scales_quantization_ops_read_are_stored_narrow_where_exact(tmp_path, rng):
    """A weight's scale that is no product operand (a layer without a bias) is stored as float16
    where float16 holds it, as are the scales of QLinearConv; an activation's scale off the grid,
    and a float32 tensor of the same values that no quantization op reads, keep 4 bytes."""
    from onnx import TensorProto, helper, numpy_helper

    on_grid = (np.abs(rng.standard_normal(8)) / 64).astype(np.float16).astype(np.float32)
    codes = rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    initializers = {
        "w_q": codes, "w_scale": on_grid, "w_zero": np.zeros(8, np.int8),
        "x_scale": np.array(0.0123, np.float32), "x_zero": np.array(128, np.uint8),
        "y_scale": np.array(0.0456, np.float32), "y_zero": np.array(128, np.uint8),
        "act_scales": (np.abs(rng.standard_normal(8)) + 0.1).astype(np.float32),  # off the grid
        "same_values": on_grid.copy() * 2,  # no quantization op reads it
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], axis=0),
        helper.make_node("Conv", ["x", "w"], ["conv"]),
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
        helper.make_node("QLinearConv", ["xq", "x_scale", "x_zero", "w_q", "w_scale", "w_zero", "y_scale", "y_zero"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zero"], ["y"]),
        helper.make_node("Mul", ["conv", "act_scales"], ["c2"], ),
        helper.make_node("Unsqueeze", ["same_values", "axes"], ["v"]),
        helper.make_node("Mul", ["c2", "v"], ["out"]),
    ]
    initializers["act_scales"] = initializers["act_scales"].reshape(1, 8, 1, 1)
    initializers["axes"] = np.array([0, 2, 3], np.int64)
    graph = helper.make_graph(nodes, "scales", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "y")],
                              [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), optimize=0)
    path = tmp_path / "scales.eim"
    model.save(path)
    stored = {name: size_breakdown(path).initializer_bytes[name] for name in ("w_scale", "act_scales", "same_values")}
    assert stored == {"w_scale": 8 * 2, "act_scales": 8 * 4, "same_values": 8 * 4}
    loaded = ei.load(path)
    assert loaded.graph.content_hash() == model.graph.content_hash()
    assert np.array_equal(loaded.graph.initializers["w_scale"].view(np.uint32), on_grid.view(np.uint32))
    x = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)}
    want = ei.Session(model, backend="numpy").run(x)
    got = ei.Session(loaded, backend="numpy").run(x)
    assert all(np.array_equal(got[name], want[name]) for name in ("out", "y"))


def _narrow_file(tmp_path, rng, identity_graph, eim_file):
    path = tmp_path / "n.eim"
    ei.Model(identity_graph({"bias": rng.integers(-300, 300, 32).astype(np.int32)})).save(path)
    return eim_file.read(path)


@pytest.mark.parametrize("edit, match", [
    (lambda e: e.update(stored="int64"), r"\.stored: expected one of int8, int16"),
    (lambda e: e.update(dtype="float32", stored="int16"), r"\.stored: expected one of float16"),
    (lambda e: e.update(dtype="uint8", stored="int8"), r"\.stored: expected no narrower storage"),
    (lambda e: e.update(nbytes=32), r"\.nbytes: expected 64 \(shape \[32\] x 2 bytes\)"),
])
def test_a_bad_narrow_entry_is_refused(tmp_path, rng, identity_graph, eim_file, edit, match):
    parsed = _narrow_file(tmp_path, rng, identity_graph, eim_file)
    entry = next(e for e in parsed.document["tensors"] if "stored" in e)
    assert entry["stored"] == "int16"
    edit(entry)
    bad = tmp_path / "bad.eim"
    bad.write_bytes(parsed.pack())
    with pytest.raises(ModelFormatError, match=match):
        ei.load(bad)


def test_a_version_3_1_file_has_no_narrow_entries(tmp_path, rng, identity_graph, eim_file):
    """Narrow storage is version 3.2's: a 3.1 file naming it is refused (an unknown field)."""
    parsed = _narrow_file(tmp_path, rng, identity_graph, eim_file)
    parsed.document["version"] = [3, 1]
    bad = tmp_path / "bad.eim"
    bad.write_bytes(parsed.pack(minor=1))
    with pytest.raises(ModelFormatError, match="unknown 'stored'"):
        ei.load(bad)
