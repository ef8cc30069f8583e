"""Empty constants (issue 40): a tensor with a zero-sized dim whose own buffer is empty, as
onnx-tf writes the shape operand of a RESHAPE to a scalar, is a constant holding no values
(LiteRT runs such a file); a tensor that nothing defines is still refused, with a message
saying what was expected and what was found."""

from __future__ import annotations

import re

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.format.tflite.writer import ModelWriter

litert = pytest.importorskip("ai_edge_litert.interpreter")

X = np.array([[1.5]], np.float32)
C = np.array([0.5, -1.0, 2.0], np.float32)


def _scalar_reshape_model(*, shape_buffer: str = "empty", shape_dims: tuple[int, ...] = (0,),
                          swapped: bool = False) -> bytes:
    """``y = RESHAPE(x, shape) + c``: x [1, 1] to a scalar by an int32 shape tensor of
    ``shape_dims``. ``shape_buffer``: "empty" (a buffer of its own with no bytes, onnx-tf's
    form) or "sentinel" (buffer 0, which marks an activation). ``swapped``: the ADD comes
    first (reads the RESHAPE's output before it is written)."""
    writer = ModelWriter()
    x = writer.add_tensor("x", (1, 1), "float32")
    if shape_buffer == "empty":
        shape = writer.add_tensor("shape", shape_dims, "int32", data=np.zeros(shape_dims, np.int32))
        writer.buffers[writer.tensors[shape].buffer] = b""  # a real buffer entry, written without data
    else:
        shape = writer.add_tensor("shape", shape_dims, "int32")
    scalar = writer.add_tensor("scalar", (), "float32")
    c = writer.add_tensor("c", C.shape, "float32", data=C)
    y = writer.add_tensor("y", C.shape, "float32")
    writer.add_operator("RESHAPE", [x, shape], [scalar])
    writer.add_operator("ADD", [scalar, c], [y], options="AddOptions", fused_activation_function=0)
    if swapped:
        writer.operators.reverse()
    writer.inputs, writer.outputs = [x], [y]
    return writer.to_bytes()


def _litert(data: bytes) -> np.ndarray:
    interpreter = litert.Interpreter(model_content=data)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], X)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_empty_shape_constant_matches_litert(backend, tmp_path):
    path = tmp_path / "reshape_to_scalar.tflite"
    path.write_bytes(_scalar_reshape_model())
    reference = _litert(path.read_bytes())
    model = ei.convert(path)
    with ei.Session(model, backend=backend) as session:
        (got,) = session.run({model.inputs[0].name: X}).values()
    assert_close(got, reference)


def test_empty_constant_holds_its_dtype_and_shape(tmp_path):
    from edgeinfer.converters.tflite.reader import read_model

    data = _scalar_reshape_model(shape_dims=(2, 0))
    model = read_model(data)
    subgraph = model.subgraphs[0]
    tensor = next(t for t in subgraph.tensors if t.name == "shape")
    constant = model.tensor_data(tensor, subgraph)
    assert constant is not None and constant.dtype == np.int32 and constant.shape == (2, 0)


@pytest.mark.parametrize("shape_buffer, shape_dims, found", [
    ("sentinel", (0,), "buffer 0"),  # an activation nobody produces, even if empty
    ("empty", (1,), r"buffer \d+ .*empty"),  # a non-empty tensor without its bytes
])
def test_undefined_tensor_is_refused_precisely(shape_buffer, shape_dims, found):
    data = _scalar_reshape_model(shape_buffer=shape_buffer, shape_dims=shape_dims)
    with pytest.raises(ei.ModelFormatError) as info:
        ei.convert(data)
    message = str(info.value)
    assert "operator #0 (RESHAPE)" in message and "'shape'" in message
    assert "expected" in message and "found" in message
    assert "no operator writes it" in message
    assert re.search(found, message), message


def test_operator_out_of_order_is_named():
    with pytest.raises(ei.ModelFormatError, match=r"operator #0 \(ADD\) reads tensor #2 'scalar'.*"
                                                  r"expected .*found none: operator #1 \(RESHAPE\) writes it only later"):
        ei.convert(_scalar_reshape_model(swapped=True))
