"""The stage planner costs the copies a pipeline cut adds between devices: with a slow link the
cut moves to where the activations crossing it are small; a cut where values go to the host
anyway, and every cut of a plan all on the host, cost nothing more.

A backend on a device that does not exist here ("fakegpu": the numpy engine, with values said
to live on that device and a measured link of its own) stands in for a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.backend import Backend, CompileOptions, Executable, get_backend
from edgeinfer.ir import Graph, Node
from edgeinfer.runtime.stream.split import (
    DEFAULT_LINK_BYTES_PER_SECOND,
    HANDOFF_SECONDS,
    cut_seconds,
    device_cut_seconds,
    link_bandwidth,
    split,
)

WIDE, NARROW = 4096, 16
# x -> a (wide) -> s (narrow) -> b, c, d, e, f (wide) -> y (narrow): the balanced cut of nine
# equal nodes is among the wide values, the narrow ``s`` crosses a cut before node 2 only
TEXT = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, {NARROW}] x) => (float[1, {NARROW}] y)
<float[{NARROW}, {WIDE}] w1, float[{WIDE}, {NARROW}] w2, float[{NARROW}, {WIDE}] w3, float[{WIDE}, {NARROW}] w4> {{
  a = MatMul(x, w1)
  s = MatMul(a, w2)
  b = MatMul(s, w3)
  c = Relu(b)
  d = Relu(c)
  e = Relu(d)
  f = Relu(e)
  g = Relu(f)
  y = MatMul(g, w4)
}}
"""
NARROW_CUT = 2  # the cut just before node 2: only ``s`` crosses it
SLOW = {("cpu", "fakegpu"): 1e5, ("fakegpu", "cpu"): 1e5}  # bytes per second


def _model() -> ei.Model:
    import onnx
    from onnx import numpy_helper, parser

    proto = parser.parse_model(TEXT)  # the weights are added below, then the model is checked
    rng = np.random.default_rng(0)
    for name, shape in (("w1", (NARROW, WIDE)), ("w2", (WIDE, NARROW)), ("w3", (NARROW, WIDE)), ("w4", (WIDE, NARROW))):
        weight = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        proto.graph.initializer.append(numpy_helper.from_array(weight, name))
    onnx.checker.check_model(proto)
    return ei.convert(proto, optimize=0)


@pytest.fixture(scope="module")
def model():
    return _model()


class FakeGpu(Backend):
    """numpy's kernels, with values said to stay on "fakegpu" and a slow link to it."""

    name = "fakegpu"
    device = "fakegpu"

    def __init__(self, links=None):
        self.inner = get_backend("numpy")
        self.links = dict(links or {})

    def supports(self, node: Node, graph: Graph) -> str | None:
        return self.inner.supports(node, graph)

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        return self.inner.compile(graph, options)

    def value_device(self) -> str:
        return "fakegpu"

    def link_bytes_per_second(self):
        return dict(self.links)


def test_a_slow_link_moves_the_cut_to_the_narrow_activation(model):
    graph = model.graph
    costs = [1e-3] * len(graph.nodes)
    free = split(costs, 2, [0.0] * len(costs))
    assert free[0][1] != NARROW_CUT  # balancing alone cuts among the wide values
    cut = device_cut_seconds(graph, ["fakegpu"] * len(graph.nodes), SLOW)
    # a cut inside a run of device nodes copies what crosses it to the host and back
    assert cut[NARROW_CUT] == pytest.approx(2 * NARROW * 4 / 1e5)
    assert cut[5] == pytest.approx(2 * WIDE * 4 / 1e5)
    ranges = split(costs, 2, cut)
    assert ranges == [(0, NARROW_CUT), (NARROW_CUT, len(costs))]


def test_cuts_on_the_host_and_at_the_way_to_the_host_cost_no_copies(model):
    graph = model.graph
    n = len(graph.nodes)
    assert device_cut_seconds(graph, ["cpu"] * n, SLOW) == [0.0] * n
    # nodes 0..4 on the device, the rest on the host: ``d`` goes to the host at the cut before
    # node 5 whether or not the pipeline cuts there
    devices = ["fakegpu"] * 5 + ["cpu"] * (n - 5)
    cut = device_cut_seconds(graph, devices, SLOW)
    assert cut[5] == 0.0 and cut[6] == 0.0
    assert cut[4] == pytest.approx(2 * WIDE * 4 / 1e5)  # ``c`` made and read on the device


def test_link_bandwidth_defaults_and_goes_through_the_host_between_accelerators():
    assert link_bandwidth("cuda:0", "cuda:0", {}) == float("inf")
    assert link_bandwidth("cpu", "cuda:0", {}) == DEFAULT_LINK_BYTES_PER_SECOND
    links = {("cuda:0", "cpu"): 2e9, ("cpu", "cuda:1"): 2e9}
    assert link_bandwidth("cuda:0", "cuda:1", links) == pytest.approx(1e9)


def test_cut_seconds_adds_the_hand_off_and_the_network(model):
    graph = model.graph
    backends = [FakeGpu(SLOW)] * len(graph.nodes)
    on_device = cut_seconds(graph, backends)
    copies = device_cut_seconds(graph, ["fakegpu"] * len(graph.nodes), SLOW)
    assert on_device == pytest.approx([HANDOFF_SECONDS + c for c in copies])
    host = get_backend("numpy")
    over_network = cut_seconds(graph, [host] * len(graph.nodes), 1e6)
    assert over_network[NARROW_CUT] == pytest.approx(HANDOFF_SECONDS + NARROW * 4 / 1e6)


def test_the_stream_planner_cuts_where_the_slow_link_carries_little(model):
    feeds = {"x": np.random.default_rng(1).standard_normal((1, NARROW)).astype(np.float32)}
    with ei.Session(model, backend=[FakeGpu(SLOW)], threads=2) as session:
        plan = session.pipeline_plan(feeds, stages=2, replicas=1)
        assert [stage.nodes for stage in plan.stages] == [range(0, NARROW_CUT), range(NARROW_CUT, 9)], \
            plan.describe()
        got = list(session.stream([feeds] * 3, stages=2, replicas=1))
    reference = ei.Session(model, backend="numpy").run(feeds)
    for result in got:
        assert_close(result["y"], reference["y"])
