"""Weight-only quantization (int4 / int8 blocks, com.microsoft::MatMulNBits): the packing is
onnxruntime's, the numpy kernel and onnxruntime agree with the dequantized weight computed
here independently, the error against fp32 is what block quantization allows, and the packed
weights survive the .eim round trip and ONNX export."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.ir.contrib_ops import MS_DOMAIN, pack, unpack
from edgeinfer.quantize.weight_only import quantize_blocks, weight_error

K, N = 200, 96  # K not a multiple of the block: the last block is padded


def _gemm_model(rng, *, trans_b=1, alpha=0.5, beta=2.0) -> tuple[ei.Model, np.ndarray, np.ndarray]:
    w = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=trans_b, alpha=alpha, beta=beta)
    relu = helper.make_node("Relu", ["h"], ["y"])
    graph = helper.make_graph([node, relu], "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", N])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return model, (w.T if trans_b else w) * alpha, bias * beta


def _dequantized(b, scales, zps, bits, block):
    """[K, N] float weight from MatMulNBits inputs, written from the spec with plain loops over blocks."""
    n, k_blocks, _ = b.shape
    q = unpack(b, bits).reshape(n, k_blocks, block).astype(np.float64)
    zp = np.full((n, k_blocks), 2 ** (bits - 1), np.float64) if zps is None else \
        unpack(zps.reshape(n, -1), bits)[:, :k_blocks].astype(np.float64)
    w = (q - zp[..., None]) * scales.reshape(n, k_blocks)[..., None]
    return w.reshape(n, -1)[:, :K].T


def test_pack_is_low_nibble_first_and_round_trips(rng):
    q = rng.integers(0, 16, (3, 8)).astype(np.uint8)
    packed = pack(q, 4)
    assert packed.shape == (3, 4)
    assert packed[0, 0] == q[0, 0] | (q[0, 1] << 4)
    np.testing.assert_array_equal(unpack(packed, 4), q)
    np.testing.assert_array_equal(unpack(pack(q, 8), 8), q)


@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
def test_block_error_is_at_most_half_a_step(rng, bits, zero_points):
    w = rng.standard_normal((K, N)).astype(np.float32)
    b, scales, zps = quantize_blocks(w, bits=bits, block_size=32, zero_points=zero_points)
    assert b.shape == (N, 7, 32 * bits // 8) and scales.shape == (N * 7,)
    deq = _dequantized(b, scales, zps, bits, 32)
    step = np.repeat(np.abs(scales.reshape(N, 7)), 32, axis=1)[:, :K].T
    # the block's extreme sits on a level; the opposite side may clip by at most one step
    assert (np.abs(deq - w) <= step * (1.0 if not zero_points else 0.5) + 1e-6).all()


@pytest.mark.parametrize("weights,bits,floor_db", [("int4", 4, 18.0), ("int8", 8, 40.0)])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_numpy_and_onnxruntime_match_the_dequantized_weight(rng, weights, bits, floor_db, block_size):
    model, w, bias = _gemm_model(rng)
    quantized = ei.quantize(model, weights=weights, mode="weight_only", block_size=block_size)
    nodes = [n for n in quantized.graph.nodes if n.op_type == "MatMulNBits"]
    assert len(nodes) == 1 and nodes[0].domain == MS_DOMAIN and nodes[0].attrs["bits"] == bits
    inits = quantized.graph.initializers
    b, scales = inits[nodes[0].inputs[1]], inits[nodes[0].inputs[2]]
    x = rng.standard_normal((3, K)).astype(np.float32)
    expected = np.maximum(x.astype(np.float64) @ _dequantized(b, scales, None, bits, block_size) + bias, 0)
    for backend in ("numpy", "onnxruntime"):
        with ei.Session(quantized, backend=backend) as session:
            assert session.plan.node_counts() == {backend: len(quantized.graph.nodes)}
            got = session.run({"x": x})["y"]
        assert_close(got, expected.astype(np.float32), rtol=1e-4, atol=1e-4, name=backend)  # float32 sums
    (row,) = weight_error(model, quantized, [{"x": x}])
    assert row["sqnr_db"] > floor_db and row["cosine"] > 0.98


def test_openvino_runs_the_op_within_its_quantization_error(rng):
    pytest.importorskip("openvino")
    model, w, bias = _gemm_model(rng)
    quantized = ei.quantize(model, weights="int4")
    (row,) = weight_error(model, quantized, [{"x": rng.standard_normal((2, K)).astype(np.float32)}],
                          backend="openvino")
    assert row["sqnr_db"] > 15.0  # OpenVINO may also quantize activations of compressed-weight MatMuls


def test_eim_round_trip_keeps_packed_weights_and_is_small(rng, tmp_path):
    big_k, big_n = 1024, 768
    w = rng.standard_normal((big_k, big_n)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, big_k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, big_n])],
                              [numpy_helper.from_array(w, "w")])
    model = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    quantized = ei.quantize(model, weights="int4", block_size=32)
    model.save(tmp_path / "f.eim")
    quantized.save(tmp_path / "q.eim")
    ratio = (tmp_path / "q.eim").stat().st_size / (tmp_path / "f.eim").stat().st_size
    assert ratio <= 0.16, ratio
    loaded = ei.load(tmp_path / "q.eim")
    assert any(a.dtype == np.uint8 for a in loaded.graph.initializers.values())
    x = rng.standard_normal((1, big_k)).astype(np.float32)
    assert_close(ei.Session(loaded).run({"x": x})["y"], ei.Session(quantized).run({"x": x})["y"], rtol=0, atol=0)


def test_onnx_export_loads_in_onnxruntime(rng, tmp_path):
    import onnxruntime as ort

    model, _, _ = _gemm_model(rng)
    quantized = ei.quantize(model, weights="int4", zero_points=True)
    ei.export(quantized, tmp_path / "q.onnx")
    x = rng.standard_normal((2, K)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert_close(got, ei.Session(quantized).run({"x": x})["y"], rtol=1e-4, atol=1e-4)  # float32 sums


def test_bad_options_are_typed_errors(rng):
    model, _, _ = _gemm_model(rng)
    with pytest.raises(ei.InputError, match="block_size"):
        ei.quantize(model, weights="int4", block_size=48)
    with pytest.raises(ei.InputError, match="not layers"):
        ei.quantize(model, weights="int4", exclude=["no_such_layer"])
    with pytest.raises(ei.InputError, match="weight-only"):
        ei.quantize(model, weights="int4", mode="dynamic")


def _whole_weight_blocks(weight, bits, block, zero_points):
    """The quantizer as it was before it streamed: the whole [K, N] weight padded and
    transposed at once, the same float32 formulas; the oracle for bit-identity."""
    k, n = weight.shape
    k_blocks = -(-k // block)
    qmax = 2 ** bits - 1
    w = np.zeros((n, k_blocks * block), np.float32)
    w[:, :k] = weight.T
    w = w.reshape(n, k_blocks, block)
    if zero_points:
        low, high = np.minimum(w.min(axis=-1), 0.0), np.maximum(w.max(axis=-1), 0.0)
        scale = np.maximum((high - low) / qmax, np.finfo(np.float32).tiny)
        zp = np.clip(np.rint(-low / scale), 0, qmax)
    else:
        extreme = np.take_along_axis(w, np.abs(w).argmax(axis=-1)[..., None], axis=-1)[..., 0]
        scale = extreme / -(2 ** (bits - 1))
        scale = np.where(np.abs(scale) < np.finfo(np.float32).tiny, np.finfo(np.float32).tiny, scale)
        zp = np.full(scale.shape, 2 ** (bits - 1), np.float32)
    q = np.clip(np.rint(w / scale[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    zp8 = zp.astype(np.uint8)
    if bits == 4 and zp8.shape[1] % 2:
        zp8 = np.concatenate([zp8, np.zeros((n, 1), np.uint8)], axis=1)
    return pack(q, bits), scale.reshape(-1), pack(zp8, bits).reshape(-1) if zero_points else None


@pytest.mark.parametrize("slab_bytes", [4096, 64 << 10, 1 << 30])  # tiles of part of a row, rows, the whole
@pytest.mark.parametrize("transposed", [False, True])  # a row-major [K, N]; the [K, N] view of an [N, K]
@pytest.mark.parametrize("bits,zero_points", [(4, False), (4, True), (8, False), (8, True)])
def test_streamed_quantizer_is_bit_identical_to_the_whole_weight_one(rng, bits, zero_points, transposed, slab_bytes):
    k, n, block = 1000, 130, 32  # K not a multiple of the block, an odd block count (zero points pad)
    weight = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    weight[:5] = 0.0  # blocks of zeros
    weight = weight.T if transposed else weight
    weight[64:96, 3] = np.float32(0.5) * np.sign(rng.standard_normal(32)).astype(np.float32)  # a tie of +-extremes
    weight[200, 4], weight[300, 5], weight[301, 5] = np.nan, np.inf, -np.inf  # and blocks the checker would refuse
    with np.errstate(invalid="ignore"):  # the codes of NaN and infinite blocks are garbage, the same garbage
        got = quantize_blocks(weight, bits=bits, block_size=block, zero_points=zero_points, slab_bytes=slab_bytes)
        want = _whole_weight_blocks(weight, bits, block, zero_points)
    for name, g, w in zip(("B", "scales", "zero points"), got, want):
        assert (g is None) == (w is None), name
        if w is not None:
            assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), name


def test_a_mapped_model_is_quantized_a_slab_at_a_time_with_progress(rng, tmp_path):
    """Quantizing a loaded .eim leaves (almost) none of its float weights resident (each slab's
    pages are released once packed), reports every float byte once, and gives the packed
    weights of the same model held in memory."""
    import contextlib
    import sys

    import psutil

    from edgeinfer.progress import BYTES

    w0 = rng.standard_normal((2048, 2048)).astype(np.float32)  # 16 MiB, row-major [K, N]
    w1 = rng.standard_normal((1024, 2048)).astype(np.float32)  # a Gemm's [N, K] with transB: 8 MiB
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["h"]),
                               helper.make_node("Gemm", ["h", "w1"], ["y"], transB=1)], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])],
                              [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    in_memory = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    path = tmp_path / "big.eim"
    in_memory.save(path)
    mapped = ei.load(path)
    steps = []

    class Recorder:
        @contextlib.contextmanager
        def step(self, label, total, unit=BYTES, size=None):
            done = []

            class Step:
                def advance(self, amount=1):
                    done.append(amount)

            yield Step()
            steps.append((label, total, unit, sum(done)))

    quantized = ei.quantize(mapped, weights="int4", mode="weight_only", block_size=32, progress=Recorder())
    assert steps == [("quantize weights to int4, block 32", w0.nbytes + w1.nbytes, BYTES, w0.nbytes + w1.nbytes)]
    if sys.platform.startswith("linux"):
        resident = sum(m.rss for m in psutil.Process().memory_maps(grouped=True) if m.path == str(path.resolve()))
        assert resident < (w0.nbytes + w1.nbytes) // 8, resident
    expected = ei.quantize(in_memory, weights="int4", mode="weight_only", block_size=32)
    got, want = quantized.graph.initializers, expected.graph.initializers
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes(), name
