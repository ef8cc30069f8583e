"""Every op in the PyTorch converter's registry is exercised numerically by a sample, in the
form ``torch.export`` records it and decomposed to core ATen; the docs table matches the
registry."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from pytorch_checks import assert_outputs_close, eager, run_numpy
from pytorch_op_samples import SAMPLES

import edgeinfer as ei
from edgeinfer.converters.pytorch import ops, supported_ops_markdown

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch's own pytree deprecation

DOCS = Path(__file__).resolve().parents[3] / "docs" / "pytorch_ops.md"
# Core ATen unrolls RNN layers into per-time-step ops (hundreds of nodes, ~20 s to export);
# the recurrent ops are verified in the captured form, where they stay whole.
CORE_FORM = [name for name in SAMPLES if name != "recurrent"]


@functools.cache
def program(name: str, form: str):
    sample = SAMPLES[name]
    module, inputs = sample.model(), sample.inputs()
    dynamic = tuple({0: torch.export.Dim("N", min=2)} for _ in inputs) if sample.dynamic_batch else None
    exported = torch.export.export(module, inputs, dynamic_shapes=dynamic)
    return exported.run_decompositions() if form == "core" else exported


def op_keys(exported) -> set[tuple[str, str]]:
    return {ops.op_key(node.target) for module in exported.graph_module.modules() if hasattr(module, "graph")
            for node in module.graph.nodes if node.op == "call_function"}


@pytest.mark.parametrize("form, name", [("captured", n) for n in SAMPLES] + [("core", n) for n in CORE_FORM])
def test_sample_matches_eager(form: str, name: str) -> None:
    sample = SAMPLES[name]
    module, inputs = sample.model(), sample.inputs()
    model = ei.convert(program(name, form))
    assert_outputs_close(run_numpy(model, inputs), eager(module, inputs), f"{name} ({form})")


def test_samples_cover_the_registry() -> None:
    seen = set()
    for name in SAMPLES:
        seen |= op_keys(program(name, "captured"))
    for name in CORE_FORM:
        seen |= op_keys(program(name, "core"))
    registered = set(ops.TORCH_OPS.keys())
    assert registered - seen == set(), f"registered ops no sample exercises: {sorted(registered - seen)}"
    assert seen - registered == set(), f"samples use unregistered ops: {sorted(seen - registered)}"


def test_docs_table_matches_registry() -> None:
    text = supported_ops_markdown()
    for namespace, name in ops.TORCH_OPS.keys():
        assert f"| `{namespace}::{name}` |" in text
    assert DOCS.read_text(encoding="utf-8") == text, (
        "docs/pytorch_ops.md is stale: regenerate it with "
        "`python -m edgeinfer.converters.pytorch.ops > docs/pytorch_ops.md`")


def test_op_key_names_overload_packets_and_python_operators() -> None:
    import operator

    assert ops.op_key(torch.ops.aten.conv2d.default) == ("aten", "conv2d")
    assert ops.op_key(torch.ops.aten.add.Tensor) == ("aten", "add")
    assert ops.op_key(operator.getitem) == ("python", "getitem")
    assert ops.op_key(torch.ops.higher_order.cond) == ("higher_order", "cond")


def test_registry_refuses_a_duplicate_rule() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        ops.supported("relu", category="activation", onnx=["Relu"])
