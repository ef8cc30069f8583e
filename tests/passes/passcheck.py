"""Shared checks for pass tests: build a graph from ONNX text, run one pass, and assert the
four things every rewrite test asserts (fired, node count, numerics, verify)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnx

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.ir import Graph
from edgeinfer.model import Model
from edgeinfer.passes import run_pass
from edgeinfer.passes.rules import explain

SYMBOL_SIZE = 2


def graph_of(source: str | onnx.ModelProto) -> Graph:
    """A typed IR graph of ONNX text (or a ModelProto), not optimized."""
    model = parse_model(source) if isinstance(source, str) else source
    return ei.convert(model, optimize=0).graph


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.inputs:
        shape = tuple(d if isinstance(d, int) else SYMBOL_SIZE for d in value.shape)
        dtype = np.dtype(value.dtype)
        feeds[value.name] = (rng.standard_normal(shape).astype(dtype) if dtype.kind == "f"
                             else rng.integers(0, 3, shape).astype(dtype))
    return feeds


def run(graph: Graph, feeds: dict[str, np.ndarray], backend: str = "numpy") -> dict[str, np.ndarray]:
    return ei.Session(Model(graph), backend=backend).run(feeds)


@functools.cache
def ort_available() -> bool:
    try:
        ei.Session(Model(graph_of("""<ir_version: 8, opset_import: ["" : 17]>
            g (float[1] x) => (float[1] y) { y = Relu(x) }""")), backend="onnxruntime")
    except ei.EdgeInferError:
        return False
    return True


@dataclass
class Rewritten:
    before: Graph
    after: Graph
    fired: dict[str, int]


def check_rewrite(source, pass_name: str, *, fired: dict[str, int], nodes_after: int, level: int = 2,
                  backends: tuple[str, ...] = ("numpy",), rtol: float = 1e-5, seed: int = 0,
                  feeds: dict[str, np.ndarray] | None = None) -> Rewritten:
    """Run ``pass_name`` on ``source`` and assert: it fired as expected, the node count after it
    (dead nodes removed), outputs unchanged against the unoptimized graph on the numpy backend,
    and ``verify()`` holds. Also runs the result on every backend in ``backends``."""
    before = graph_of(source) if not isinstance(source, Graph) else source
    result = run_pass(pass_name, before, level)
    after = result.graph
    assert result.modified, f"{pass_name} did not fire"
    for rule, count in fired.items():
        assert result.fired.get(rule) == count, f"{pass_name} fired {result.fired}, expected {rule} x{count}"
    after = run_pass("eliminate_dead_nodes", after).graph
    after.verify()
    assert len(after.nodes) == nodes_after, f"{len(after.nodes)} nodes after {pass_name}:\n{after}"
    assert after.input_names == before.input_names and after.output_names == before.output_names
    feeds = feeds or random_feeds(before, seed)
    reference = run(before, feeds)
    for backend in backends:
        if backend == "onnxruntime" and not ort_available():
            continue
        got = run(after, feeds, backend)
        for name in before.output_names:
            assert_close(got[name], reference[name], rtol=rtol, name=f"{name} on {backend}")
    return Rewritten(before, after, dict(result.fired))


def check_not_fired(source, pass_name: str, reason: str | None = None, *, level: int = 2) -> Graph:
    """Assert ``pass_name`` leaves the graph alone (and, with ``reason``, that a rule refused
    the match for a reason containing it)."""
    graph = graph_of(source) if not isinstance(source, Graph) else source
    result = run_pass(pass_name, graph, level)
    assert not result.modified, f"{pass_name} fired {result.fired} where it must not:\n{result.graph}"
    if reason is not None:
        from edgeinfer.passes import get_pass

        rules = getattr(get_pass(pass_name).fn, "rules", ())
        reasons = [r for _, _, r in explain(graph, rules, level)]
        assert any(reason in r for r in reasons), f"expected a refusal mentioning {reason!r}, got {reasons}"
    return graph


def ops(graph: Graph) -> list[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.nodes]


def floats(rng: np.random.Generator, *shape: int, low: float | None = None) -> str:
    """Text of a random float tensor for onnx.parser initializers."""
    data = rng.standard_normal(shape)
    if low is not None:
        data = np.abs(data) + low
    return "{" + ",".join(f"{v:.6f}" for v in data.reshape(-1)) + "}"
