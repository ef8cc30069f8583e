"""TorchScript with data-dependent ``prim::If`` / ``prim::Loop`` (issue 19's failure class):
``TS2EPConverter`` cannot rewrite it, so the converter falls back to the TorchScript ONNX
exporter, which keeps the control flow as ONNX ``If`` / ``Loop``; the route is logged and
recorded. Shape tests that the exporter writes as ``If`` fold away once shapes are static."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import edgeinfer as ei
from edgeinfer.converters import pytorch as frontend

from .pytorch_checks import assert_outputs_close, eager, run_numpy, run_onnxruntime


class Gated(nn.Module):
    """A data-dependent branch and a data-dependent loop (halve until small)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        if bool(y.mean() > 0):
            y = y * 3.0 + 1.0
        else:
            y = torch.tanh(y) - 2.0
        steps = torch.zeros(1)
        while bool(y.abs().max() > 1.0):
            y = y * 0.5
            steps = steps + 1.0
        return y, steps


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    base = torch.randn(2, 8)
    return [base, base * 3.0, base * 40.0, -base * 40.0, torch.zeros(2, 8)]  # both branches, several loop counts


def _ops(graph) -> set[str]:
    found = set()
    for node in graph.nodes:
        found.add(node.op_type)
        for sub in node.subgraphs():
            found |= _ops(sub)
    return found


@pytest.fixture(scope="module")
def scripted():
    torch.manual_seed(0)
    return torch.jit.script(Gated().eval())


def test_script_with_control_flow_falls_back_and_keeps_if_and_loop(scripted, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeinfer.converters.pytorch"):
        model = ei.convert(scripted, example_inputs=(_inputs()[0],))
    assert model.metadata[frontend.ROUTE_KEY] == frontend.ROUTE_SCRIPT_ONNX
    assert any("TS2EPConverter" in r.getMessage() and frontend.ROUTE_SCRIPT_ONNX in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert {"If", "Loop"} <= _ops(model.graph)
    references = [eager(scripted, [x]) for x in _inputs()]
    assert len({float(r[1][0]) for r in references}) > 1, "the inputs must take different loop counts"
    for x, reference in zip(_inputs(), references):
        assert_outputs_close(run_numpy(model, [x]), reference, "numpy")
        assert_outputs_close(run_onnxruntime(model, [x]), reference, "exported ONNX in onnxruntime")


def test_script_file_with_control_flow_and_input_shapes(scripted, tmp_path) -> None:
    path = tmp_path / "gated.pt"
    torch.jit.save(scripted, str(path))
    model = ei.convert(path, input_shapes={"x": (2, 8)})
    assert model.metadata[frontend.ROUTE_KEY] == frontend.ROUTE_SCRIPT_ONNX
    loaded = ei.load(_saved(model, tmp_path))
    assert loaded.metadata[frontend.ROUTE_KEY] == frontend.ROUTE_SCRIPT_ONNX
    for x in _inputs():
        assert_outputs_close(run_numpy(loaded, [x]), eager(scripted, [x]), ".eim on numpy")


def _saved(model, tmp_path):
    path = tmp_path / "gated.eim"
    model.save(path)
    return path


def test_script_without_control_flow_takes_ts2ep() -> None:
    torch.manual_seed(0)
    scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval())
    model = ei.convert(scripted, example_inputs=(torch.randn(1, 4),))
    assert model.metadata[frontend.ROUTE_KEY] == frontend.ROUTE_SCRIPT_PROGRAM
    assert model.inputs[0].shape == (1, 4) and model.outputs[0].shape == (1, 4)  # TS2EP's symbols re-exported


class Squeezer(nn.Module):
    """``squeeze(x, 1)`` in script mode, which the TorchScript exporter writes as an ``If`` on
    ``x.shape[1] == 1`` whose branches differ in rank, after a data-dependent branch."""

    def forward(self, x):
        if bool(x.sum() > 0):
            x = x + 1.0
        return torch.squeeze(x, 1).relu()


def _count(graph, op_type: str) -> int:
    return sum((node.op_type == op_type) + sum(_count(sub, op_type) for sub in node.subgraphs())
               for node in graph.nodes)


def test_shape_only_if_folds_and_output_shape_is_concrete() -> None:
    scripted = torch.jit.script(Squeezer())
    x = torch.randn(3, 1, 5, generator=torch.Generator().manual_seed(0))
    model = ei.convert(scripted, example_inputs=(x,))
    assert model.metadata[frontend.ROUTE_KEY] == frontend.ROUTE_SCRIPT_ONNX
    assert _count(model.graph, "If") == 1, "the data-dependent If stays, the squeeze's shape test folds"
    assert model.outputs[0].shape == (3, 5)
    for feed in (x, -x.abs()):
        assert_outputs_close(run_numpy(model, [feed]), eager(scripted, [feed]), "numpy")


def test_if_with_constant_condition_is_inlined_by_folding() -> None:
    """An ONNX ``If`` on ``Shape(x)[1] == 1`` with x static: folding replaces it by the branch
    taken and re-infers the shapes after it."""
    helper = onnx.helper
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "axis"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [4, 6])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [4, 1, 6])])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["dim"], axis=0),
             helper.make_node("Equal", ["dim", "one"], ["cond"]),
             helper.make_node("If", ["cond"], ["picked"], then_branch=then, else_branch=other),
             helper.make_node("Relu", ["picked"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 1, 6])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["a", "b"])],
                              [onnx.numpy_helper.from_array(np.array(1, np.int64), "one"),
                               onnx.numpy_helper.from_array(np.array([1], np.int64), "axis")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = ei.convert(proto)
    assert "If" not in _ops(model.graph)
    assert model.outputs[0].shape == (4, 6)
    x = np.random.default_rng(0).standard_normal((4, 1, 6)).astype(np.float32)
    got = ei.Session(model, backend="numpy").run({"x": x})["y"]
    np.testing.assert_array_equal(got, np.maximum(x[:, 0], 0))


def test_fallback_with_dynamic_batch(scripted) -> None:
    model = ei.convert(scripted, example_inputs=(_inputs()[0],), dynamic_batch=True)
    assert model.metadata[frontend.ROUTE_KEY] == frontend.ROUTE_SCRIPT_ONNX
    assert model.inputs[0].shape == ("N", 8)
    for batch in (1, 5):
        x = torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch)) * 10.0
        assert_outputs_close(run_numpy(model, [x]), eager(scripted, [x]), f"numpy, batch {batch}")
