"""file_span: where a loaded .eim weight's bytes are in the file, for plain views only, and
only while the file is still the one that was mapped."""

from __future__ import annotations

import sys

import numpy as np

import edgeinfer as ei
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.mapped import file_span, release_pages


def _saved(tmp_path, rng) -> tuple[ei.Model, np.ndarray]:
    w = rng.standard_normal((64, 48)).astype(np.float32)
    graph = Graph([Node("MatMul", ["x", "w"], ["y"])], [Value("x", "float32", [1, 64])],
                  [Value("y", "float32", [1, 48])], {"w": w})
    path = tmp_path / "m.eim"
    ei.Model(graph).save(path)
    return ei.load(path), w


def test_span_points_at_the_tensor_bytes(tmp_path, rng):
    model, w = _saved(tmp_path, rng)
    array = model.graph.initializers["w"]
    span = file_span(array)
    assert span is not None and span.path == str((tmp_path / "m.eim").resolve())
    assert span.nbytes == w.nbytes
    with open(span.path, "rb") as handle:
        handle.seek(span.offset)
        assert handle.read(span.nbytes) == w.tobytes()
    rows = file_span(array[10:20])  # a contiguous slice: its own offset
    assert rows is not None and rows.offset == span.offset + 10 * 48 * 4 and rows.nbytes == 10 * 48 * 4


def test_no_span_for_copies_strided_views_or_unmapped_arrays(tmp_path, rng):
    model, w = _saved(tmp_path, rng)
    array = model.graph.initializers["w"]
    assert file_span(array.T) is None  # not C-contiguous
    assert file_span(array[:, :5]) is None
    assert file_span(np.array(array)) is None  # a copy
    assert file_span(w) is None  # never mapped
    assert file_span(np.empty((0, 3), np.float32)) is None


def test_no_span_once_the_file_is_replaced(tmp_path, rng):
    model, _ = _saved(tmp_path, rng)
    _saved(tmp_path, np.random.default_rng(3))  # saved over: a new file renamed onto the path
    assert file_span(model.graph.initializers["w"]) is None


def _resident_bytes_of(path) -> int | None:
    """This process's resident bytes of the file at ``path`` (its mappings), None off Linux."""
    import psutil

    try:
        maps = psutil.Process().memory_maps(grouped=True)
    except (AttributeError, psutil.AccessDenied, NotImplementedError):
        return None
    return sum(m.rss for m in maps if m.path == str(path))


def test_release_pages_drops_a_mapped_weight_from_resident_memory(tmp_path, rng):
    w = rng.standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    graph = Graph([Node("MatMul", ["x", "w"], ["y"])], [Value("x", "float32", [1, 1024])],
                  [Value("y", "float32", [1, 1024])], {"w": w})
    path = tmp_path / "m.eim"
    ei.Model(graph).save(path)
    array = ei.load(path).graph.initializers["w"]
    assert float(array.sum(dtype=np.float64)) == float(w.sum(dtype=np.float64))  # every page read
    before = _resident_bytes_of(path.resolve())
    assert release_pages(array)
    after = _resident_bytes_of(path.resolve())
    if sys.platform.startswith("linux"):
        assert before is not None and before >= w.nbytes and after < w.nbytes // 8, (before, after)
    np.testing.assert_array_equal(array, w)  # read again from the file: nothing lost
    assert not release_pages(w)  # not mapped
    assert not release_pages(array[:, :7])  # strided
