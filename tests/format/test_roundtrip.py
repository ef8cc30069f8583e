"""Saving then loading an .eim file gives back the same graph, zero-copy and runnable."""

from __future__ import annotations

import itertools
import json
import math
import mmap
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.ir import Graph, Node, TypeSpec, Value, dtypes

HEADER_SIZE = 72  # the fixed header, as documented in edgeinfer/format/eim.py

def round_trip(model: ei.Model, tmp_path, name: str = "model.eim") -> ei.Model:
    path = tmp_path / name
    model.save(path)
    return ei.load(path)


def assert_same_graph(got: Graph, want: Graph) -> None:
    assert got.content_hash() == want.content_hash()
    assert str(got) == str(want)
    assert got.metadata == want.metadata
    assert got.opset == want.opset
    for name, value in want.values.items():
        assert (got.values[name].dtype, got.values[name].shape) == (value.dtype, value.shape), name


def mapped_buffer(array: np.ndarray) -> mmap.mmap | None:
    """The mmap an array's memory belongs to, following its chain of bases."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def test_mlp_round_trip_is_exact_and_runs_the_same(mlp_model, tmp_path, rng):
    model = ei.convert(mlp_model, optimize=0)  # the format, not the passes, is under test
    loaded = round_trip(model, tmp_path)
    assert_same_graph(loaded.graph, model.graph)
    assert loaded.metadata == model.metadata
    x = rng.standard_normal((5, 8)).astype(np.float32)
    want = ei.Session(model, backend="numpy").run({"x": x})
    got = ei.Session(loaded, backend="numpy").run({"x": x})
    assert list(got) == list(want)
    for name in want:
        assert_close(got[name], want[name], name=name)


def test_subgraphs_round_trip_with_their_initializers(if_model, tmp_path):
    loaded = round_trip(if_model, tmp_path)
    assert_same_graph(loaded.graph, if_model.graph)
    then_branch = loaded.graph.nodes[0].attrs["then_branch"]
    assert isinstance(then_branch, Graph) and set(then_branch.initializers) == {"k"}
    assert mapped_buffer(then_branch.initializers["k"]) is not None
    x = np.arange(4, dtype=np.float32)
    for cond in (True, False):
        feeds = {"x": x, "c": np.array(cond)}
        want = ei.Session(if_model, backend="numpy").run(feeds)["y"]
        assert_close(ei.Session(loaded, backend="numpy").run(feeds)["y"], want)


def attribute_zoo(identity_graph) -> dict:
    rng = np.random.default_rng(3)
    branch = identity_graph({"inner": rng.standard_normal((2, 2)).astype(np.float32)}, name="branch")
    return {
        "int": 7, "neg_int": -3, "big_int": 2**62, "bool": True, "false": False,
        "float": 0.1, "neg_zero": -0.0, "tiny": 5e-324, "huge": 1.7976931348623157e308,
        "nan": math.nan, "inf": math.inf, "ninf": -math.inf,
        "str": "héllo ☃", "empty_str": "", "surrogate": "a\udc80b",
        "bytes": b"\x00\xff\xfe raw", "empty_bytes": b"",
        "ints": (1, -2, 3), "floats": (1.5, math.nan, -math.inf), "strings": ("a", "", "ü"),
        "empty": (), "nested": ((1, 2), (), ("x",)),
        "tensor": rng.standard_normal((3, 4)).astype(np.float32),
        "int_tensor": np.arange(6, dtype=np.int64).reshape(2, 3),
        "scalar_tensor": np.array(2.5, dtype=np.float64),
        "empty_tensor": np.zeros((0,), dtype=np.float32),
        "str_tensor": np.array([["a", "bb"], ["", "ü"]], dtype=object),
        "tensors": (np.ones(2, np.int8), np.array(["s"], dtype=object)),
        "graph": branch, "graphs": (branch, identity_graph({"z": np.zeros(1, np.uint8)}, name="other")),
        "type": TypeSpec("float32", ("N", 3, None)), "type_unknown": TypeSpec(None, None),
        "type_seq": TypeSpec("sequence(int64)"),
        "np_float": np.float32(1.25), "np_int": np.int64(-9), "np_bool": np.bool_(True),
        "np_bf16": np.array(1.5, dtype=dtypes.numpy_dtype("bfloat16"))[()],
    }


def test_every_attribute_kind_round_trips(tmp_path, identity_graph):
    attrs = attribute_zoo(identity_graph)
    node = Node("Everything", ["x"], ["y"], attrs, domain="test.zoo", name="zoo")
    graph = Graph([node], [Value("x", "float32", ("N", "C", None, 4))], [Value("y", "float32", None)],
                  opset={"": 17, "test.zoo": 3}, name="zoo_graph", metadata={"graph_key": "v"})
    model = ei.Model(graph, {"k": "v", "unicode": "ø"})
    loaded = round_trip(model, tmp_path)
    assert_same_graph(loaded.graph, graph)
    got = loaded.graph.nodes[0].attrs
    assert list(got) == list(attrs)
    for key, want in attrs.items():
        value = got[key]
        if isinstance(want, float):
            assert isinstance(value, float) and (math.isnan(want) and math.isnan(value)
                                                 or (value == want and math.copysign(1, value)
                                                     == math.copysign(1, want))), key
        elif isinstance(want, np.ndarray):
            assert value.dtype == want.dtype and value.shape == want.shape, key
            assert_close(value, want, name=key)
        elif isinstance(want, np.generic):
            assert type(value) is type(want) and value == want, key
        elif isinstance(want, (Graph, tuple)):
            continue  # covered by the content hash and the text dump above
        else:
            assert type(value) is type(want) and value == want, key
    assert got["empty"] == ()
    assert got["type"] == TypeSpec("float32", ("N", 3, None))
    assert loaded.graph.inputs[0].shape == ("N", "C", None, 4)
    assert loaded.graph.outputs[0].shape is None


@pytest.mark.parametrize("name", dtypes.NUMERIC_DTYPES)
def test_every_whitelisted_dtype_round_trips_bit_exact(name, tmp_path, identity_graph):
    dtype = dtypes.numpy_dtype(name)
    rng = np.random.default_rng(len(name))
    raw = rng.integers(0, 256, size=2 * 3 * dtype.itemsize, dtype=np.uint8)
    full = raw.view(dtype).reshape(2, 3) if name != "bool" else (raw % 2).astype(bool).reshape(2, 3)
    arrays = {"full": full, "scalar": full.reshape(-1)[:1].reshape(()).copy(),
              "empty": np.zeros((0,), dtype), "empty3d": np.zeros((3, 0, 2), dtype)}
    loaded = round_trip(ei.Model(identity_graph(arrays)), tmp_path)
    assert loaded.graph.content_hash() == identity_graph(arrays).content_hash()
    for key, want in arrays.items():
        got = loaded.graph.initializers[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert got.tobytes() == want.tobytes(), key  # bit-exact, NaN payloads included
        assert not got.flags.writeable


def test_string_tensors_round_trip_including_bytes_elements(tmp_path, identity_graph):
    arrays = {"words": np.array([["x", "yé"], ["", "z" * 100]], dtype=object),
              "scalar": np.array("only", dtype=object),
              "empty": np.zeros((0, 2), dtype=object),
              "raw": np.array([b"\xff\x00", "text"], dtype=object)}
    loaded = round_trip(ei.Model(identity_graph(arrays)), tmp_path)
    assert loaded.graph.content_hash() == identity_graph(arrays).content_hash()
    for key, want in arrays.items():
        got = loaded.graph.initializers[key]
        assert got.dtype == object and got.shape == want.shape
        assert got.tolist() == want.tolist()


def test_weights_are_read_only_views_of_the_file_mapping(tmp_path, rng, identity_graph, eim_file):
    arrays = {"w": rng.standard_normal((64, 33)).astype(np.float32),
              "i": rng.integers(-5, 5, (7,)).astype(np.int16)}
    path = tmp_path / "mapped.eim"
    ei.Model(identity_graph(arrays)).save(path)
    loaded = ei.load(path)
    parsed = eim_file.read(path)
    for index, (key, want) in enumerate(arrays.items()):
        got = loaded.graph.initializers[key]
        buffer = mapped_buffer(got)
        assert buffer is not None and not got.flags.writeable
        whole = np.frombuffer(buffer, dtype=np.uint8)
        assert np.shares_memory(got, whole)
        address = got.__array_interface__["data"][0] - whole.__array_interface__["data"][0]
        assert address == parsed.data_offset + parsed.document["tensors"][index]["offset"]
        assert_close(got, want)
        with pytest.raises(ValueError):
            got[...] = 0


def test_layout_is_aligned_and_exactly_sized(tmp_path, rng, identity_graph, eim_file):
    sizes = (1, 17, 0, 64, 3)
    arrays = {f"t{i}": rng.standard_normal(size).astype(np.float32) for i, size in enumerate(sizes)}
    arrays.update(b=np.array([True, False, True]), d=np.array([2.5, -1.0]), h=np.ones(5, np.float16))
    path = tmp_path / "layout.eim"
    ei.Model(identity_graph(arrays)).save(path)
    raw = path.read_bytes()
    parsed = eim_file.parse(raw)
    assert parsed.magic == b"EIM\x00" and (parsed.major, parsed.minor) == (3, 0)
    assert parsed.document["version"] == [3, 0]
    assert parsed.data_offset % 64 == 0 and parsed.data_offset >= HEADER_SIZE + parsed.json_length
    assert parsed.data_offset + parsed.data_length == len(raw)
    entries = parsed.document["tensors"]
    assert len(entries) == len(arrays)
    spans = []
    for entry, want in zip(entries, arrays.values(), strict=True):
        # 64 bytes or more at a multiple of 64, smaller tensors at a multiple of their element size
        assert entry["offset"] % (64 if want.nbytes >= 64 else want.itemsize) == 0
        assert entry["nbytes"] == want.nbytes
        spans.append((entry["offset"], entry["offset"] + entry["nbytes"], want.nbytes >= 64))
        start = entry["offset"]
        assert parsed.data[start:start + entry["nbytes"]] == want.tobytes()
    spans.sort()
    assert all(a_end <= b_start for (_, a_end, _), (b_start, _, _) in itertools.pairwise(spans))
    assert [large for *_, large in spans] == sorted((large for *_, large in spans), reverse=True)
    assert parsed.data_length == spans[-1][1]  # no padding after the last tensor
    small = [(start, end) for start, end, large in spans if not large and end > start]
    assert all(a_end == b_start for (_, a_end), (b_start, _) in itertools.pairwise(small))  # packed, no gaps


def test_version_1_files_still_load(tmp_path, small_model, if_model, identity_graph, eim_file):
    """Files written by the 1.0 writer (every tensor 64-aligned, plain JSON document)."""
    data = Path(__file__).parent / "data"
    for name, model in (("small", small_model), ("branchy", if_model)):
        parsed = eim_file.read(data / f"{name}_v1.eim")
        assert (parsed.major, parsed.minor, parsed.flags) == (1, 0, 0)
        assert all(t["offset"] % 64 == 0 for t in parsed.document["tensors"] if "offset" in t)
        loaded = ei.load(data / f"{name}_v1.eim")
        assert_same_graph(loaded.graph, model.graph)
        assert all(mapped_buffer(a) is not None for a in loaded.graph.initializers.values() if a.size)
    mixed = ei.load(data / "mixed_v1.eim")
    assert {k: v.dtype.name for k, v in mixed.graph.initializers.items()} == {
        "w": "float32", "scale": "float32", "zp": "uint8", "ids": "int64", "half": "float16"}
    resaved = tmp_path / "mixed_v2.eim"
    mixed.save(resaved)
    assert resaved.stat().st_size < (data / "mixed_v1.eim").stat().st_size
    assert_same_graph(ei.load(resaved).graph, mixed.graph)


def test_identical_constants_are_stored_once(tmp_path, rng, identity_graph, eim_file):
    weight = rng.standard_normal((8, 8)).astype(np.float32)
    arrays = {"zp_a": np.zeros(16, np.int8), "zp_b": np.zeros(16, np.int8), "zp_other_dtype": np.zeros(16, np.uint8),
              "w": weight, "w_copy": weight.copy(), "w_other": weight + 1, "neg_zero": np.full(16, -0.0, np.float32),
              "zero": np.zeros(16, np.float32), "long_zero": np.zeros(4096, np.float32),
              "long_middle_one": np.zeros(4096, np.float32)}
    arrays["long_middle_one"][2048] = 1  # same first and last bytes, different content
    path = tmp_path / "dedup.eim"
    ei.Model(identity_graph(arrays)).save(path)
    assert len(eim_file.read(path).document["tensors"]) == len(arrays) - 2  # zp_b and w_copy
    loaded = ei.load(path).graph.initializers
    assert loaded["zp_a"] is loaded["zp_b"] and loaded["w"] is loaded["w_copy"]
    assert loaded["zp_other_dtype"].dtype == np.uint8 and loaded["w_other"] is not loaded["w"]
    assert np.signbit(loaded["neg_zero"]).all() and not np.signbit(loaded["zero"]).any()  # bytes, not values
    for key, want in arrays.items():
        assert_close(loaded[key], want, name=key)


def test_tied_weights_are_stored_once_and_stay_shared(tmp_path, rng, eim_file):
    shared = rng.standard_normal((4, 4)).astype(np.float32)
    graph = Graph([Node("Add", ["a", "b"], ["y"])], [], [Value("y", "float32", (4, 4))],
                  {"a": shared, "b": shared}, opset={"": 17})
    path = tmp_path / "tied.eim"
    ei.Model(graph).save(path)
    assert len(eim_file.read(path).document["tensors"]) == 1
    loaded = ei.load(path)
    assert loaded.graph.initializers["a"] is loaded.graph.initializers["b"]
    assert_close(ei.Session(loaded).run({})["y"], shared + shared)


def test_strided_and_big_endian_arrays_are_written_in_c_order_little_endian(tmp_path, rng, identity_graph):
    base = rng.standard_normal((5, 6)).astype(np.float32)
    arrays = {"transposed": base.T, "every_other": base[:, ::2], "big_endian": base.astype(">f4")}
    loaded = round_trip(ei.Model(identity_graph(arrays)), tmp_path)
    for key, want in arrays.items():
        got = loaded.graph.initializers[key]
        assert got.flags.c_contiguous and got.dtype == np.dtype("float32")
        assert_close(got, want, name=key)


def test_saving_is_deterministic(small_model, tmp_path):
    small_model.save(tmp_path / "a.eim")
    small_model.save(tmp_path / "b.eim")
    assert (tmp_path / "a.eim").read_bytes() == (tmp_path / "b.eim").read_bytes()


def test_document_is_plain_json_with_no_executable_content(saved, eim_file):
    parsed = eim_file.read(saved)
    assert parsed.text.isascii()
    text = parsed.text.decode()
    assert json.loads(text) == parsed.document
    assert "pickle" not in text and "__" not in text


def test_reload_of_a_loaded_model_is_identical(small_model, tmp_path):
    once = round_trip(small_model, tmp_path, "one.eim")
    twice = round_trip(once, tmp_path, "two.eim")
    assert_same_graph(twice.graph, small_model.graph)
    assert (tmp_path / "one.eim").read_bytes() == (tmp_path / "two.eim").read_bytes()


def test_a_loaded_model_can_be_saved_over_its_own_file(saved, small_model):
    before = saved.read_bytes()
    loaded = ei.load(saved)
    loaded.save(saved)  # reads weights from the old mapping while writing the new file
    assert saved.read_bytes() == before
    assert ei.load(saved).graph.content_hash() == small_model.graph.content_hash()


def test_overwriting_a_mapped_file_leaves_the_loaded_model_intact(small_model, tmp_path, rng, identity_graph):
    path = tmp_path / "live.eim"
    small_model.save(path)
    live = ei.load(path)
    before = {k: v.copy() for k, v in live.graph.initializers.items()}
    other = ei.Model(identity_graph({"q": rng.standard_normal(1000).astype(np.float32)}))
    other.save(path)
    for key, want in before.items():
        assert_close(live.graph.initializers[key], want, name=key)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    assert_close(ei.Session(live).run({"x": x})["y"], ei.Session(small_model).run({"x": x})["y"])
    assert set(ei.load(path).graph.initializers) == {"q"}
