"""Version 3.1 int8-stored weights: a float32 weight declared int8-stored (``weight_storage``
metadata, ``{"int8": {name: axis}}``) that is exactly int8 values times one float32 scale per
channel is stored as those two, a quarter of its bytes, and multiplied back on load."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.errors import ModelFormatError
from edgeinfer.ir.weights import int8_factors, int8_rounded, int8_stored_weights, with_int8_stored_weights


@pytest.mark.parametrize("shape, axis", [((16, 3, 3, 3), 0), ((8, 1, 3, 3), 0), ((24, 40), 1), ((5, 7), -1),
                                         ((4, 6, 2, 2), 1)])
def test_rounded_weights_factor_exactly_and_stay_within_half_a_step(rng, shape, axis):
    """Every rounded weight is q * scale bit for bit (the scale recomputed from the rounded values
    is the one they were rounded with), and each value moved at most half a step of its channel."""
    for trial in range(20):
        w = (rng.standard_normal(shape) * rng.uniform(1e-3, 10.0)).astype(np.float32)
        w[..., 0] = 0.0 if trial % 3 == 0 else w[..., 0]
        rounded = int8_rounded(w, axis)
        factors = int8_factors(rounded, axis)
        assert factors is not None
        q, scale = factors
        assert q.dtype == np.int8 and scale.dtype == np.float32 and np.abs(q).max() <= 127
        product = np.multiply(q, scale, dtype=np.float32)
        assert np.array_equal(product.view(np.uint32), rounded.view(np.uint32))
        step = np.broadcast_to(scale, w.shape)
        assert np.all(np.abs(rounded - w) <= 0.5 * step * (1 + 1e-5) + 1e-30)


def test_a_channel_of_zeros_and_float_weights_never_rounded(rng):
    w = rng.standard_normal((4, 9)).astype(np.float32)
    w[2] = -0.0
    rounded = int8_rounded(w, 0)
    assert int8_factors(rounded, 0) is not None and not np.any(rounded[2])
    assert int8_factors(w, 0) is None  # plain float weights are no int8 product
    assert int8_factors(rounded.astype(np.float64), 0) is None
    assert int8_factors(rounded, 2) is None  # an axis the weight does not have
    with pytest.raises(ValueError, match="NaN"):
        int8_rounded(np.array([[np.nan, 1.0]], np.float32), 0)


def _model(identity_graph, rng, *, rounded: bool = True) -> ei.Model:
    w = (rng.standard_normal((32, 3, 3, 3)) * 0.2).astype(np.float32)
    graph = identity_graph({"w": int8_rounded(w, 0) if rounded else w, "bias": rng.standard_normal(32).astype(np.float32)})
    graph.metadata = with_int8_stored_weights(graph.metadata, {"w": 0})
    return ei.Model(graph)


def test_an_int8_stored_weight_takes_a_quarter_and_reads_back_bit_identical(tmp_path, rng, identity_graph, eim_file):
    model = _model(identity_graph, rng)
    path = tmp_path / "w.eim"
    model.save(path)
    parsed = eim_file.read(path)
    # 3.2: the scales, on the float16 grid (``int8_rounded``), are stored as float16 (narrow storage)
    assert (parsed.major, parsed.minor) == (3, 2) and parsed.document["version"] == [3, 2]
    entries = parsed.document["tensors"]
    product = next(e for e in entries if "product" in e)
    q, scale = (entries[i] for i in product["product"])
    assert product["shape"] == [32, 3, 3, 3] and "offset" not in product
    assert (q["dtype"], q["shape"], scale["dtype"], scale["shape"]) == ("int8", [32, 3, 3, 3], "float32", [32, 1, 1, 1])
    assert scale["stored"] == "float16" and scale["nbytes"] == 32 * 2
    float_path = tmp_path / "f.eim"
    ei.Model(identity_graph({k: v for k, v in model.graph.initializers.items()})).save(float_path)
    assert parsed.data_length < 0.5 * eim_file.read(float_path).data_length
    loaded = ei.load(path)
    got, want = loaded.graph.initializers["w"], model.graph.initializers["w"]
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert loaded.graph.content_hash() == model.graph.content_hash()
    assert int8_stored_weights(loaded.graph.metadata) == {"w": 0}
    out = ei.Session(loaded, backend="numpy").run({})
    assert np.array_equal(out["w_out"], want)


def test_a_weight_that_is_no_int8_product_keeps_its_bytes_and_version_3_0(tmp_path, rng, identity_graph, eim_file):
    model = _model(identity_graph, rng, rounded=False)
    path = tmp_path / "w.eim"
    model.save(path)
    parsed = eim_file.read(path)
    assert (parsed.major, parsed.minor) == (3, 0)
    assert not any("product" in e for e in parsed.document["tensors"])
    assert np.array_equal(ei.load(path).graph.initializers["w"], model.graph.initializers["w"])


@pytest.mark.parametrize("operands, match", [
    ("swapped", "int8 values then their float32 scale"),
    ("two int8", "int8 values then their float32 scale"),
])
def test_bad_int8_products_are_refused(tmp_path, rng, identity_graph, eim_file, operands, match):
    path = tmp_path / "w.eim"
    _model(identity_graph, rng).save(path)
    parsed = eim_file.read(path)
    entry = next(e for e in parsed.document["tensors"] if "product" in e)
    q, scale = entry["product"]
    entry["product"] = [scale, q] if operands == "swapped" else [q, q]
    bad = tmp_path / "bad.eim"
    bad.write_bytes(parsed.pack())
    with pytest.raises(ModelFormatError, match=match):
        ei.load(bad)


def test_storage_declarations_survive_other_declarations_and_drop_with_their_weight():
    from edgeinfer.ir.weights import stored_weights, with_live_stored_weights, with_stored_weights

    metadata = with_stored_weights(with_int8_stored_weights({}, {"w": 0, "m": 1}), ["h"], "float16")
    assert int8_stored_weights(metadata) == {"w": 0, "m": 1} and stored_weights(metadata) == {"h": "float16"}
    live = with_live_stored_weights(metadata, {"w": None, "h": None})
    assert int8_stored_weights(live) == {"w": 0} and stored_weights(live) == {"h": "float16"}
    assert "weight_storage" not in with_live_stored_weights(metadata, {})
