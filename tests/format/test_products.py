"""Version 3 product entries: a float32 weight declared (``weight_products`` metadata) as the
element-wise product of two others is stored as their references when the product gives the
same bits, and multiplied back on load."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.errors import ModelFormatError
from edgeinfer.ir.weights import with_weight_products


def _model(identity_graph, rng, exact: bool = True) -> ei.Model:
    x = np.float32(rng.uniform(0.01, 0.1))
    w = rng.uniform(1e-4, 1e-2, 24).astype(np.float32)
    product = np.multiply(np.asarray(x), w, dtype=np.float32)
    if not exact:
        product = np.nextafter(product, np.float32(1))  # one ulp off: not the product's bits
    graph = identity_graph({"x_scale": np.asarray(x), "w_scale": w, "b_scale": product})
    graph.metadata = with_weight_products(graph.metadata, {"b_scale": ("x_scale", "w_scale")})
    return ei.Model(graph)


def test_exact_product_is_stored_as_references_and_read_back_bit_identical(tmp_path, rng, identity_graph, eim_file):
    model = _model(identity_graph, rng)
    path = tmp_path / "p.eim"
    model.save(path)
    parsed = eim_file.read(path)
    entries = parsed.document["tensors"]
    products = [e for e in entries if "product" in e]
    assert len(products) == 1 and products[0]["shape"] == [24] and "offset" not in products[0]
    assert parsed.data_length == 4 + 24 * 4  # x_scale and w_scale only
    loaded = ei.load(path)
    got, want = loaded.graph.initializers["b_scale"], model.graph.initializers["b_scale"]
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not got.flags.writeable
    assert loaded.graph.content_hash() == model.graph.content_hash()
    out = ei.Session(loaded, backend="numpy").run({})
    assert np.array_equal(out["b_scale_out"], want)


def test_inexact_declaration_stores_the_bytes(tmp_path, rng, identity_graph, eim_file):
    model = _model(identity_graph, rng, exact=False)
    path = tmp_path / "p.eim"
    model.save(path)
    assert not any("product" in e for e in eim_file.read(path).document["tensors"])
    got = ei.load(path).graph.initializers["b_scale"]
    assert np.array_equal(got, model.graph.initializers["b_scale"])


def _tampered(tmp_path, rng, identity_graph, eim_file, change, **header):
    path = tmp_path / "p.eim"
    _model(identity_graph, rng).save(path)
    parsed = eim_file.read(path)
    entry = next(e for e in parsed.document["tensors"] if "product" in e)
    change(entry, parsed.document)
    bad = tmp_path / "bad.eim"
    bad.write_bytes(parsed.pack(**header))
    return bad


@pytest.mark.parametrize("change, match", [
    (lambda e, d: e.update(shape=[25]), "broadcasting to the entry's shape"),
    (lambda e, d: e.update(dtype="float16"), "float32 .a product entry"),
    (lambda e, d: e.update(product=[0]), "two tensor indices"),
    (lambda e, d: e.update(product=[0, 99]), "product"),
    (lambda e, d: e.update(product=[2, 1]) if d["tensors"].index(e) == 2 else e.update(product=[e["product"][0],
                                                                                                 d["tensors"].index(e)]),
     "not products"),
])
def test_bad_product_entries_are_refused(tmp_path, rng, identity_graph, eim_file, change, match):
    with pytest.raises(ModelFormatError, match=match):
        ei.load(_tampered(tmp_path, rng, identity_graph, eim_file, change))


def test_version_2_has_no_product_entries(tmp_path, rng, identity_graph, eim_file):
    def to_v2(entry, document):
        document["version"] = [2, 0]

    path = _tampered(tmp_path, rng, identity_graph, eim_file, to_v2, major=2, flags=2)
    with pytest.raises(ModelFormatError):
        ei.load(path)
    path = _tampered(tmp_path, rng, identity_graph, eim_file, to_v2, major=2, flags=1)
    with pytest.raises(ModelFormatError, match="missing offset, nbytes|offset"):
        ei.load(path)
