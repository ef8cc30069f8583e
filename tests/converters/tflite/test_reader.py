"""The flatbuffer reader: hand-made models, external buffers, and every way a file can be
broken (each must raise ``ModelFormatError``, never IndexError/struct.error)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.converters import tflite
from edgeinfer.errors import EdgeInferError
from edgeinfer.format.tflite import schema

X = np.array([[1.0, 2.0, -3.0, 4.0]], np.float32)
C = np.array([0.5, -1.0, 2.0, -3.0], np.float32)


def _run(model: ei.Model) -> np.ndarray:
    (out,) = ei.Session(model).run({model.inputs[0].name: X}).values()
    return out


def _interpreter(data: bytes) -> np.ndarray | None:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return None
    interpreter = Interpreter(model_content=data)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], X)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_hand_built_model_matches_numpy_and_interpreter(tflite_builder):
    data = tflite_builder()
    assert tflite.accepts(data)
    model = ei.convert(data)
    assert [t.name for t in model.inputs] == ["x"] and [t.name for t in model.outputs] == ["y"]
    assert_close(_run(model), np.maximum(X + C, 0))
    reference = _interpreter(data)
    if reference is not None:
        assert_close(_run(model), reference)


def test_external_buffer(tflite_builder, tmp_path):
    data = tflite_builder(external=True)
    path = tmp_path / "external.tflite"
    path.write_bytes(data)
    assert_close(_run(ei.convert(path)), np.maximum(X + C, 0))


def test_external_buffer_past_the_end(tflite_builder):
    data = tflite_builder(external=True)
    with pytest.raises(ei.ModelFormatError, match="buffer 2 .*outside"):
        ei.convert(data[:-4])


@pytest.mark.parametrize("field, value, message", [
    ("opcode_index", 5, "opcode index 5"),
    ("tensor_index", 9, "refers to tensor 9"),
    ("buffer_index", 17, "buffer 17"),
])
def test_bad_indices(tflite_builder, field, value, message):
    with pytest.raises(ei.ModelFormatError, match=message):
        ei.convert(tflite_builder(**{field: value}))


def test_buffer_length_must_match_shape(tflite_builder):
    with pytest.raises(ei.ModelFormatError, match="holds 12 bytes, expected 16"):
        ei.convert(tflite_builder(constant=C[:3]))


def test_unsupported_op_is_named(tflite_builder):
    code = schema.BUILTIN_OPERATORS.index("LSH_PROJECTION")
    with pytest.raises(ei.UnsupportedOpError, match="LSH_PROJECTION") as info:
        ei.convert(tflite_builder(opcode=code))
    assert "operator #0" in str(info.value)


def test_unknown_fused_activation(tflite_builder):
    with pytest.raises(ei.UnsupportedOpError, match="SIGN_BIT"):
        ei.convert(tflite_builder(fused_activation=schema.ACTIVATIONS.index("SIGN_BIT")))


@pytest.mark.parametrize("data, message", [
    (b"", "at least 8 bytes"),
    (b"\x08\x00\x00\x00XXXX\x00\x00\x00\x00", "identifier"),
    (b"\xff\xff\xff\x7fTFL3", "outside"),
])
def test_not_a_model(data, message):
    with pytest.raises(ei.ModelFormatError, match=message):
        tflite.convert(data)


def test_missing_file(tmp_path):
    with pytest.raises(ei.ModelFormatError, match="no such file"):
        ei.convert(tmp_path / "absent.tflite")


def test_every_truncation_is_a_format_error(tflite_builder):
    data = tflite_builder()
    for length in range(len(data)):
        with pytest.raises(ei.ModelFormatError):
            tflite.convert(data[:length])


def test_random_corruption_never_escapes_as_a_crash(tflite_builder):
    data = bytearray(tflite_builder())
    rng = np.random.default_rng(0)
    outcomes = {"converted": 0, "refused": 0}
    for _ in range(400):
        mutated = bytearray(data)
        for position in rng.integers(0, len(data), size=rng.integers(1, 4)):
            mutated[position] = int(rng.integers(0, 256))
        try:
            ei.convert(bytes(mutated))
            outcomes["converted"] += 1
        except EdgeInferError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0 and sum(outcomes.values()) == 400


def test_import_does_not_need_tensorflow(tflite_builder, tmp_path):
    path = tmp_path / "add.tflite"
    path.write_bytes(tflite_builder())
    script = (
        "import sys\n"
        "sys.modules['tensorflow'] = None\n"  # any import of tensorflow now fails
        "import numpy as np, edgeinfer as ei\n"
        f"m = ei.convert({str(path)!r})\n"
        "out = ei.Session(m).run({'x': np.ones((1, 4), np.float32)})['y']\n"
        "assert out.shape == (1, 4)\n"
        "assert not any(k.startswith(('tensorflow', 'keras')) and sys.modules[k] is not None for k in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
