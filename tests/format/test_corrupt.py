"""Every malformed .eim file raises ModelFormatError (or ModelValidationError for a graph that
breaks an IR invariant), never any other exception, and nothing is trusted before it is checked."""

from __future__ import annotations

import copy
import json
import lzma
import zlib
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.errors import ModelFormatError, ModelValidationError


def write(tmp_path: Path, raw: bytes, name: str = "bad.eim") -> Path:
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def load_fails(path: Path, match: str | None = None) -> ModelFormatError:
    with pytest.raises(ModelFormatError, match=match) as info:
        ei.load(path)
    assert str(path) in str(info.value)  # every message names the file
    return info.value


@pytest.fixture
def parsed(saved, eim_file):
    return eim_file.read(saved)


def tampered(tmp_path, parsed, edit) -> Path:
    """The saved file with ``edit(document)`` applied and the checksum re-sealed."""
    changed = copy.deepcopy(parsed)
    edit(changed.document)
    return write(tmp_path, changed.pack())


# -- the file as a whole -----------------------------------------------------------------------------
def test_missing_file(tmp_path):
    load_fails(tmp_path / "nope.eim", "no such file")


def test_empty_file(tmp_path):
    load_fails(write(tmp_path, b""), "empty")


def test_directory(tmp_path):
    load_fails(tmp_path, "directory")


def test_not_a_path():
    with pytest.raises(ModelFormatError, match="expected a file path"):
        ei.load(12.5)


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes(tmp_path, seed):
    raw = np.random.default_rng(seed).integers(0, 256, 50 + 300 * seed, dtype=np.uint8).tobytes()
    load_fails(write(tmp_path, raw), "not an .eim file")


def test_random_bytes_behind_the_magic(tmp_path):
    raw = b"EIM\x00" + np.random.default_rng(9).integers(0, 256, 500, dtype=np.uint8).tobytes()
    load_fails(write(tmp_path, raw))


def test_other_model_format(tmp_path, mlp_model):
    load_fails(write(tmp_path, mlp_model.SerializeToString()), "expected magic")


def test_every_truncation_is_refused(saved, tmp_path):
    raw = saved.read_bytes()
    assert len(raw) < 2048  # small enough to try every prefix
    for length in range(len(raw)):
        path = write(tmp_path, raw[:length], "cut.eim")
        with pytest.raises(ModelFormatError):
            ei.load(path)


def test_trailing_bytes_are_refused(saved, tmp_path):
    load_fails(write(tmp_path, saved.read_bytes() + bytes(64)), "truncated, extended or corrupt")


# -- the header -----------------------------------------------------------------------------------
def test_wrong_magic(parsed, tmp_path):
    load_fails(write(tmp_path, parsed.pack(magic=b"EIM\x01")), "expected magic")


def test_newer_major_version(parsed, tmp_path):
    parsed.document["version"] = [4, 0]
    load_fails(write(tmp_path, parsed.pack(major=4)), "newer edgeinfer")


def test_older_major_version(parsed, tmp_path):
    load_fails(write(tmp_path, parsed.pack(major=0)), "expected major version 1 or 2")


def test_newer_minor_version_with_new_fields_is_readable(parsed, tmp_path, small_model):
    parsed.document["version"] = [3, 7]
    parsed.document["future_field"] = {"anything": [1, 2]}
    parsed.document["graph"]["nodes"][0]["future_node_field"] = True
    loaded = ei.load(write(tmp_path, parsed.pack(minor=7)))
    assert loaded.graph.content_hash() == small_model.graph.content_hash()


def test_unknown_field_in_current_version(parsed, tmp_path):
    parsed.document["graph"]["nodes"][0]["surprise"] = 1
    load_fails(write(tmp_path, parsed.pack()), "unknown 'surprise'")


@pytest.mark.parametrize("field, value", [("flags", 4), ("flags", 0x80000002), ("reserved", 1)])
def test_unknown_flags(parsed, tmp_path, field, value):
    load_fails(write(tmp_path, parsed.pack(**{field: value})), r"expected flags within 0x3 and reserved 0")


def test_version_2_defines_no_xz_flag(parsed, tmp_path):
    parsed.document["version"] = [2, 0]
    load_fails(write(tmp_path, parsed.pack(major=2, flags=2)), r"expected flags within 0x1")


def test_both_compressions_are_refused(parsed, tmp_path):
    load_fails(write(tmp_path, parsed.pack(flags=3)), "found both")


def test_version_1_defines_no_flags(parsed, tmp_path):
    parsed.document["version"] = [1, 0]
    load_fails(write(tmp_path, parsed.pack(major=1, minor=0)), "expected flags within 0x0")


def test_json_length_past_end_of_file(parsed, tmp_path):
    load_fails(write(tmp_path, parsed.pack(json_length=10**9)), "JSON length")


def test_json_length_zero(parsed, tmp_path):
    load_fails(write(tmp_path, parsed.pack(json_length=0)), "JSON length")


def test_data_offset_not_where_the_json_ends(parsed, tmp_path):
    load_fails(write(tmp_path, parsed.pack(data_offset=parsed.data_offset + 64)), "data section offset")


def test_data_length_disagrees_with_file_size(parsed, tmp_path):
    load_fails(write(tmp_path, parsed.pack(data_length=parsed.data_length + 64)), "truncated")


def test_bad_checksum(parsed, tmp_path):
    stored = bytearray(parsed.json_bytes)
    stored[len(stored) // 2] ^= 0x10
    load_fails(write(tmp_path, parsed.pack(json_bytes=bytes(stored), reseal=False)), "checksum")


def test_bad_checksum_of_a_plain_document(parsed, tmp_path):
    text = parsed.text.replace(b'"small"', b'"smell"')
    load_fails(write(tmp_path, parsed.pack(json_bytes=text, flags=0, reseal=False)), "checksum")


# -- the compressed document -----------------------------------------------------------------------
@pytest.mark.parametrize("stored, match", [
    (b"not zlib at all", "fails to inflate"),
    (zlib.compress(b"{}")[:-3], "truncated stream"),
    (zlib.compress(b"{}") + b"tail", "4 bytes after its end"),
])
def test_corrupt_compressed_document(parsed, tmp_path, stored, match):
    load_fails(write(tmp_path, parsed.pack(json_bytes=stored, flags=1)), match)


@pytest.mark.parametrize("stored, match", [
    (b"not xz at all", "fails to inflate"),
    (lzma.compress(b"{}", lzma.FORMAT_XZ)[:-3], "truncated stream|fails to inflate"),
    (lzma.compress(b"{}", lzma.FORMAT_XZ) + b"tail", "4 bytes after its end"),
])
def test_corrupt_xz_document(parsed, tmp_path, stored, match):
    load_fails(write(tmp_path, parsed.pack(json_bytes=stored, flags=2)), match)


def test_zlib_document_in_version_3_is_readable(parsed, tmp_path, small_model):
    loaded = ei.load(write(tmp_path, parsed.pack(json_bytes=zlib.compress(parsed.text), flags=1)))
    assert loaded.graph.content_hash() == small_model.graph.content_hash()


def test_document_inflating_past_the_limit_is_refused(parsed, tmp_path, monkeypatch):
    from edgeinfer.format import reading

    monkeypatch.setattr(reading, "MAX_JSON_BYTES", len(parsed.text) - 1)
    load_fails(write(tmp_path, parsed.pack()), "at most .* bytes once inflated")
    load_fails(write(tmp_path, parsed.pack(flags=1)), "at most .* bytes once inflated")


def test_plain_document_in_version_2_is_readable(parsed, tmp_path, small_model):
    loaded = ei.load(write(tmp_path, parsed.pack(json_bytes=parsed.text, flags=0)))
    assert loaded.graph.content_hash() == small_model.graph.content_hash()


# -- the JSON document -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, match", [
    (b"{not json", "JSON document"),
    (b"[1, 2, 3]", "expected an object"),
    (b'{"a": NaN}', "NaN"),
    (b'{"a": Infinity}', "Infinity"),
    (b'{"a": 1, "a": 2}', "unique keys"),
    (b'{"\xff": 1}', "UTF-8"),
    (b"[" * 100000 + b"]" * 100000, "nest"),
    (b'{"a": 1' + b"0" * 5000 + b"}", "JSON document"),  # an integer too long to convert
    (b"{}", "missing format, version, metadata, tensors, graph"),
])
@pytest.mark.parametrize("compressed", [True, False])
def test_invalid_json(parsed, tmp_path, text, match, compressed):
    stored = zlib.compress(text) if compressed else text
    load_fails(write(tmp_path, parsed.pack(json_bytes=stored, flags=int(compressed))), match)


def test_format_name_and_version_must_match(parsed, tmp_path):
    load_fails(tampered(tmp_path, parsed, lambda d: d.update(format="onnx")), "document.format")
    load_fails(tampered(tmp_path, parsed, lambda d: d.update(version=[1, 1])), "as in the header")


def test_metadata_must_be_strings(parsed, tmp_path):
    load_fails(tampered(tmp_path, parsed, lambda d: d["metadata"].update(x=1)), r"metadata\['x'\]")


# -- the tensor table --------------------------------------------------------------------------------
def first_numeric(document) -> dict:
    return next(t for t in document["tensors"] if t["dtype"] != "str")


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.update(offset=t["offset"] + 10**6 * 64), "offset"),
    (lambda t: t.update(offset=2), "a multiple of 4 "),
    (lambda t: t.update(shape=[4]), "nbytes"),
    (lambda t: t.update(shape=[-1]), r"shape\[0\]"),
    (lambda t: t.update(shape=[2**40, 2**40, 2**40]), "nbytes"),
    (lambda t: t.update(shape=[2**40, 2**40], nbytes=2**80 * 4), "nbytes"),
    (lambda t: t.update(shape=[1] * 65), "at most 64 dims"),
    (lambda t: t.update(shape=[3.0]), r"shape\[0\]"),
    (lambda t: t.update(shape=[True, 3]), r"shape\[0\]"),
    (lambda t: t.update(dtype="complex64"), "dtype"),
    (lambda t: t.update(dtype="object"), "dtype"),
    (lambda t: t.update(dtype=None), "dtype"),
    (lambda t: t.update(nbytes=-12), "nbytes"),
    (lambda t: t.pop("offset"), "missing offset"),
    (lambda t: t.update(offset="0"), "offset"),
])
def test_bad_tensor_entry(parsed, tmp_path, edit, match):
    load_fails(tampered(tmp_path, parsed, lambda d: edit(first_numeric(d))), match)


def test_tensor_ending_past_the_data_section(parsed, tmp_path):
    def edit(document):
        entry = first_numeric(document)
        assert entry["dtype"] == "float32"
        entry["offset"] = (parsed.data_length - 1) // 4 * 4  # aligned, in bounds, but its bytes run past the end
        entry["shape"], entry["nbytes"] = [3], 12
    load_fails(tampered(tmp_path, parsed, edit), "within the")


def test_overlapping_tensors(parsed, tmp_path):
    def edit(document):
        numeric = [t for t in document["tensors"] if t["dtype"] != "str"]
        numeric[1]["offset"] = numeric[0]["offset"]
    load_fails(tampered(tmp_path, parsed, edit), "not shared with tensor")


def test_invalid_bool_bytes(parsed, tmp_path):
    entry = next(t for t in parsed.document["tensors"] if t["dtype"] == "bool")
    data = bytearray(parsed.data)
    data[entry["offset"]] = 2
    parsed.data = bytes(data)
    load_fails(write(tmp_path, parsed.pack()), "bool bytes")


def test_string_tensor_entries_are_checked(tmp_path, eim_file, identity_graph):
    path = tmp_path / "str.eim"
    ei.Model(identity_graph({"s": np.array(["a", "b"], dtype=object)})).save(path)
    base = eim_file.read(path)
    for edit, match in [(lambda t: t.update(shape=[3]), "3 strings"),
                        (lambda t: t.update(strings=["a", 1]), r"strings\[1\]"),
                        (lambda t: t.update(strings=["a", {"t": "bytes", "b64": "!!"}]), "base64"),
                        (lambda t: t.update(strings=["a", {"t": "tensor", "b64": ""}]), "'bytes'"),
                        (lambda t: t.update(offset=0), "unknown 'offset'")]:
        load_fails(tampered(tmp_path, base, lambda d, edit=edit: edit(d["tensors"][0])), match)


# -- the graph ---------------------------------------------------------------------------------------
def graph_of(document) -> dict:
    return document["graph"]


@pytest.mark.parametrize("edit, match", [
    (lambda g: g["initializers"][0].update(tensor=99), "tensor"),
    (lambda g: g["initializers"][0].update(tensor=-1), "tensor"),
    (lambda g: g["initializers"][0].update(tensor="0"), "tensor"),
    (lambda g: g["initializers"].append(dict(g["initializers"][0])), "unique"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "pickle", "v": "x"}), "tag"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "tensor", "ref": 99}), r"bad'\]\.ref"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "tensor"}), "missing ref"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "float", "v": "1.5"}), "'nan'"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "bytes", "b64": "***"}), "base64"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "scalar", "dtype": "int8", "v": 300}), "int8"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "scalar", "dtype": "str", "v": "x"}), "dtype"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"t": "graph", "graph": {}}), "missing name"),
    (lambda g: g["nodes"][0]["attrs"].update(bad={"no": "tag"}), "tag"),
    (lambda g: g["nodes"][0]["attrs"].update(bad=None), "attribute value"),
    (lambda g: g["nodes"][0]["attrs"].update(bad=json.loads("[" * 40 + "1" + "]" * 40)), "nested"),
    (lambda g: g["nodes"][0].update(op_type=""), "op_type"),
    (lambda g: g["nodes"][0].update(inputs="x"), "inputs"),
    (lambda g: g["nodes"][0].update(inputs=[1]), r"inputs\[0\]"),
    (lambda g: g["nodes"][0].update(attrs=[]), "attrs"),
    (lambda g: g["nodes"].append(7), r"nodes\[3\]"),
    (lambda g: g["inputs"][0].update(shape=["N", -3]), r"shape\[1\]"),
    (lambda g: g["inputs"][0].update(shape=[2**64]), r"shape\[0\]"),
    (lambda g: g["inputs"][0].update(shape=[1.5]), r"shape\[0\]"),
    (lambda g: g["inputs"][0].update(shape="N"), "shape"),
    (lambda g: g["inputs"][0].update(name=""), "name"),
    (lambda g: g["inputs"][0].update(dtype=5), "dtype"),
    (lambda g: g.update(opset={"": "17"}), "opset"),
    (lambda g: g.update(opset=[17]), "opset"),
    (lambda g: g.update(metadata=None), "metadata"),
    (lambda g: g.pop("value_info"), "missing value_info"),
    (lambda g: g.update(nodes={}), "nodes"),
])
def test_bad_graph_document(parsed, tmp_path, edit, match):
    load_fails(tampered(tmp_path, parsed, lambda d: edit(graph_of(d))), match)


def test_subgraph_problems_are_found_deep_inside(if_model, tmp_path, eim_file):
    path = tmp_path / "if.eim"
    if_model.save(path)
    base = eim_file.read(path)

    def edit(document):
        then_graph = document["graph"]["nodes"][0]["attrs"]["then_branch"]["graph"]
        then_graph["initializers"][0]["tensor"] = 42
    error = load_fails(tampered(tmp_path, base, edit))
    assert "then_branch" in str(error) and "initializers[0].tensor" in str(error)


def test_deeply_nested_subgraphs_are_refused(parsed, tmp_path):
    def edit(document):
        graph = document["graph"]
        inner = copy.deepcopy(graph)
        for _ in range(40):
            inner = {**copy.deepcopy(graph), "nodes": [{"op_type": "Wrap", "domain": "", "name": "",
                                                        "inputs": [], "outputs": [],
                                                        "attrs": {"g": {"t": "graph", "graph": inner}}}]}
        graph["nodes"].append({"op_type": "Wrap", "domain": "", "name": "", "inputs": [], "outputs": [],
                               "attrs": {"g": {"t": "graph", "graph": inner}}})
    load_fails(tampered(tmp_path, parsed, edit), "nested at most")


def test_graph_with_a_cycle(parsed, tmp_path):
    def edit(document):
        nodes = graph_of(document)["nodes"]
        nodes[0]["inputs"][0] = nodes[-1]["outputs"][0]  # the first node now reads the last one's output
    with pytest.raises(ModelValidationError, match="bad.eim"):
        ei.load(tampered(tmp_path, parsed, edit))


def test_graph_with_an_undefined_input(parsed, tmp_path):
    def edit(document):
        graph_of(document)["nodes"][1]["inputs"][0] = "ghost"
    with pytest.raises(ModelValidationError, match="'ghost'"):
        ei.load(tampered(tmp_path, parsed, edit))


def test_graph_with_a_duplicate_producer(parsed, tmp_path):
    def edit(document):
        nodes = graph_of(document)["nodes"]
        nodes[1]["outputs"][0] = nodes[0]["outputs"][0]
    with pytest.raises(ModelValidationError, match="produced"):
        ei.load(tampered(tmp_path, parsed, edit))


def test_initializer_type_disagreeing_with_its_declaration(parsed, tmp_path):
    """An initializer that is also declared as an input with another dtype breaks verify()."""
    def edit(document):
        graph = graph_of(document)
        name = graph["initializers"][0]["name"]
        graph["inputs"].append({"name": name, "dtype": "int64", "shape": [3]})
    with pytest.raises(ModelValidationError, match="int64"):
        ei.load(tampered(tmp_path, parsed, edit))


# -- fuzzing -----------------------------------------------------------------------------------------
ALLOWED = (ModelFormatError, ModelValidationError)


def load_or_refuse(path: Path) -> bool:
    """True if the file loaded, False if refused with a typed error; anything else propagates."""
    try:
        ei.load(path)
    except ALLOWED:
        return False
    return True


def test_fuzz_bytes(saved, tmp_path):
    raw = saved.read_bytes()
    rng = np.random.default_rng(2024)
    outcomes = []
    for _ in range(300):
        data = bytearray(raw)
        kind = rng.integers(0, 4)
        if kind == 0:  # flip bits in a few bytes anywhere
            for at in rng.integers(0, len(data), rng.integers(1, 4)):
                data[at] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:  # flip a byte of the header
            data[int(rng.integers(0, 72))] ^= int(rng.integers(1, 256))
        elif kind == 2:  # truncate
            del data[int(rng.integers(0, len(data))):]
        else:  # insert junk
            at = int(rng.integers(0, len(data)))
            data[at:at] = rng.integers(0, 256, int(rng.integers(1, 100)), dtype=np.uint8).tobytes()
        outcomes.append(load_or_refuse(write(tmp_path, bytes(data), "fuzz.eim")))
    assert not all(outcomes)  # the mutations did hit checked parts


JUNK = [None, -1, 0, 2**70, 1.5, "", "x", [], {}, [None], {"t": "tensor", "ref": 0},
        {"t": "graph", "graph": None}, {"t": "scalar", "dtype": "bool", "v": 1}, True, [-1, 2], ["N"],
        {"t": "float", "v": {}}, {"t": "scalar", "dtype": "bfloat16", "v": 2**70},
        [{"t": "tensor", "ref": 0}, 1],
        [[{"t": "tensor", "ref": 0}]], {"t": "type", "dtype": None, "shape": [-2]}, {"t": "bytes", "b64": 5}]


def all_paths(obj, prefix=()):
    """Every (container, key) position inside a JSON value."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return
    for key, value in items:
        yield prefix + (key,)
        yield from all_paths(value, prefix + (key,))


def test_fuzz_document_structure(if_model, tmp_path, eim_file):
    """Re-sealed documents with one field replaced, removed or mangled: the checksum passes, so
    this drives the schema validator itself."""
    path = tmp_path / "if.eim"
    if_model.save(path)
    base = eim_file.read(path)
    paths = list(all_paths(base.document))
    rng = np.random.default_rng(7)
    refused = 0
    for _ in range(300):
        changed = copy.deepcopy(base)
        where = paths[int(rng.integers(0, len(paths)))]
        parent = changed.document
        for key in where[:-1]:
            parent = parent[key]
        action = rng.integers(0, 3)
        if action == 0:
            parent[where[-1]] = copy.deepcopy(JUNK[int(rng.integers(0, len(JUNK)))])
        elif action == 1:
            del parent[where[-1]]
        elif isinstance(parent, dict):
            parent[f"{where[-1]}_extra"] = 1
        else:
            parent.append(copy.deepcopy(parent[where[-1]]))
        refused += not load_or_refuse(write(tmp_path, changed.pack(), "fuzz.eim"))
    assert refused > 200  # nearly every structural change is caught


def test_fuzz_json_text(saved, tmp_path, eim_file):
    """Byte-level damage to the JSON text with the checksum re-sealed."""
    base = eim_file.read(saved)
    text = base.json_bytes
    rng = np.random.default_rng(11)
    for _ in range(200):
        data = bytearray(text)
        for at in rng.integers(0, len(data), rng.integers(1, 3)):
            data[at] = int(rng.choice(list(b'{}[]",:0123456789-.eEtfn\\ \x00\xff')))
        load_or_refuse(write(tmp_path, base.pack(json_bytes=bytes(data)), "fuzz.eim"))


def test_documents_written_here_are_valid_json_for_other_readers(saved, eim_file):
    text = eim_file.read(saved).text.decode("ascii")
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
