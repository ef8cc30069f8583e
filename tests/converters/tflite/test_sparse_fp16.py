"""Weights that real TFLite files store compactly: sparse tensors (TFLite's sparsity format,
behind DENSIFY) and float16 weights behind DEQUANTIZE. Files come from TF's own TFLite
converter; edgeinfer's import is compared with the LiteRT interpreter on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.converters.tflite.reader import read_model
from edgeinfer.converters.tflite.sparsity import DENSE, SPARSE_CSR, DimensionMetadata, Sparsity, densify
from edgeinfer.errors import ModelFormatError
from edgeinfer.ir.weights import stored_weight_dtype

tf = pytest.importorskip("tensorflow")
litert = pytest.importorskip("ai_edge_litert.interpreter")


def _conv_model(seed: int, keep: float):
    rng = np.random.default_rng(seed)
    x = tf.keras.Input((8, 8, 16), batch_size=1)
    conv = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu")
    dense = tf.keras.layers.Conv2D(8, 1)
    model = tf.keras.Model(x, dense(conv(x)))
    weights, bias = conv.get_weights()
    conv.set_weights([(weights * (rng.random(weights.shape) < keep)).astype(np.float32),
                      rng.standard_normal(bias.shape).astype(np.float32)])
    return model


@pytest.fixture(scope="module")
def sparse_file(tmp_path_factory) -> str:
    converter = tf.lite.TFLiteConverter.from_keras_model(_conv_model(0, keep=0.2))
    converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    path = tmp_path_factory.mktemp("sparse") / "sparse.tflite"
    path.write_bytes(converter.convert())
    return str(path)


@pytest.fixture(scope="module")
def fp16_file(tmp_path_factory) -> str:
    converter = tf.lite.TFLiteConverter.from_keras_model(_conv_model(1, keep=1.0))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    path = tmp_path_factory.mktemp("fp16") / "fp16.tflite"
    path.write_bytes(converter.convert())
    return str(path)


def _litert(path: str, x: np.ndarray) -> np.ndarray:
    interpreter = litert.Interpreter(model_path=path, num_threads=1)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def _run(model: ei.Model, x: np.ndarray, backend: str = "numpy") -> np.ndarray:
    with ei.Session(model, backend=backend) as session:
        return next(iter(session.run({model.inputs[0].name: x}).values()))


def _opcodes(path_or_bytes) -> list[str]:
    data = open(path_or_bytes, "rb").read() if isinstance(path_or_bytes, str) else path_or_bytes
    return [op.opcode for op in read_model(data).subgraphs[0].operators]


def test_sparse_weights_are_densified(sparse_file):
    model = read_model(open(sparse_file, "rb").read())
    assert any(t.sparsity is not None for t in model.subgraphs[0].tensors), "the file holds no sparse tensor"
    assert "DENSIFY" in _opcodes(sparse_file)
    x = np.random.default_rng(2).standard_normal((1, 8, 8, 16)).astype(np.float32)
    converted = ei.convert(sparse_file)
    assert_close(_run(converted, x), _litert(sparse_file, x))


def _block_csr(dense: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, Sparsity]:
    """Encode a 2-D array by the TFLite sparsity spec: rows of blocks dense, block columns CSR,
    each kept block dense in row-major order (the layout TF writes for block sparsity)."""
    rows, cols = dense.shape[0] // block[0], dense.shape[1] // block[1]
    blocks = dense.reshape(rows, block[0], cols, block[1]).transpose(0, 2, 1, 3)
    kept = np.abs(blocks).sum(axis=(2, 3)) != 0
    segments = np.concatenate([[0], np.cumsum(kept.sum(axis=1))])
    indices = np.nonzero(kept)[1]
    values = blocks[kept].reshape(-1)
    dims = (DimensionMetadata(DENSE, rows, None, None), DimensionMetadata(SPARSE_CSR, 0, segments, indices),
            DimensionMetadata(DENSE, block[0], None, None), DimensionMetadata(DENSE, block[1], None, None))
    return values, Sparsity((0, 1, 2, 3), (0, 1), dims)


def test_block_sparse_layout_is_densified():
    rng = np.random.default_rng(3)
    dense = rng.standard_normal((6, 8)).astype(np.float32)
    dense.reshape(3, 2, 4, 2)[rng.random((3, 1, 4, 1)).repeat(2, 1).repeat(2, 3) < 0.6] = 0
    values, sparsity = _block_csr(dense, (2, 2))
    assert values.size < dense.size
    np.testing.assert_array_equal(densify(values, dense.shape, sparsity, "test"), dense)


def test_inconsistent_sparsity_is_refused():
    values, sparsity = _block_csr(np.eye(4, dtype=np.float32), (2, 2))
    with pytest.raises(ModelFormatError, match="holds 7 values"):
        densify(values[:-1], (4, 4), sparsity, "test")


def test_fp16_weights_stay_stored_weights(fp16_file, tmp_path):
    opcodes = _opcodes(fp16_file)
    assert "DEQUANTIZE" in opcodes
    model = ei.convert(fp16_file)
    histogram = model.graph.op_histogram()
    assert histogram.get("Cast", 0) == 0, histogram  # no Cast per request
    weights = [n.inputs[1] for n in model.graph.nodes if n.op_type == "Conv"]
    assert weights and all(stored_weight_dtype(model.graph, w) == "float16" for w in weights)
    assert all(model.graph.values[w].const is not None for w in weights)  # Transposes folded at import
    x = np.random.default_rng(4).standard_normal((1, 8, 8, 16)).astype(np.float32)
    reference = _litert(fp16_file, x)
    assert_close(_run(model, x), reference)

    # .eim keeps the float16 bytes and loads float32 weights that are still float16-stored
    model.save(tmp_path / "m.eim")
    loaded = ei.load(tmp_path / "m.eim")
    fp32_bytes = sum(a.nbytes for a in model.graph.initializers.values())
    assert (tmp_path / "m.eim").stat().st_size < 0.6 * fp32_bytes + 4096
    assert all(stored_weight_dtype(loaded.graph, w) == "float16" for w in weights)
    assert_close(_run(loaded, x, "tflite"), reference)

    # re-exported, the file has the original's operators (float16 behind DEQUANTIZE, no TRANSPOSE)
    exported = tmp_path / "again.tflite"
    ei.export(loaded, exported)
    again = _opcodes(str(exported))
    assert "TRANSPOSE" not in again
    assert sorted(op for op in again if op != "RELU") == sorted(op for op in opcodes if op != "RELU")
    assert_close(_litert(str(exported), x), reference)
