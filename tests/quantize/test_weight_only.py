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
