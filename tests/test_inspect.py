"""``edgeinfer inspect``: summary, quantization, JSON, Graphviz dot, self-contained HTML."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import onnx
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit import zoo
from edgeinfer.cli import graphview, main
from edgeinfer.ir.cost import node_flops


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def cnn_file(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(zoo.cnn_residual_depthwise(size=16, channels=4), path)
    return path


def test_summary_figures_come_from_the_graph(cnn_file):
    result = invoke("inspect", cnn_file)
    assert result.exit_code == 0, result.output
    graph = ei.convert(cnn_file).graph
    params = sum(int(a.size) for a in graph.initializers.values())
    flops = sum(node_flops(n, graph) for n in graph.nodes)
    assert f"params  {params:,} (" in result.output
    assert f"flops   {flops:,.0f}" in result.output
    assert "quant   no (float32)" in result.output
    assert f"nodes   {len(graph.nodes)}" in result.output


def test_json_summary_to_stdout(cnn_file):
    result = invoke("inspect", cnn_file, "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    graph = ei.convert(cnn_file).graph
    assert document["nodes"] == len(graph.nodes)
    assert sum(document["ops"].values()) == len(graph.nodes)
    assert [i["name"] for i in document["inputs"]] == graph.input_names


def test_quantized_and_fp16_models_say_so(tmp_path, cnn_file):
    model = ei.convert(cnn_file)
    int8 = tmp_path / "int8.eim"
    with pytest.warns(UserWarning):  # random calibration data warns
        ei.quantize(model, random_samples=4).save(int8)
    result = invoke("inspect", int8)
    assert result.exit_code == 0, result.output
    quant_ops = sum(1 for n in ei.load(int8).graph.nodes if n.op_type == "QuantizeLinear")
    assert f"QuantizeLinear x{quant_ops}" in result.output.split("quant   int8 (")[1]
    fp16 = tmp_path / "fp16.eim"
    ei.quantize(ei.convert(zoo.cnn_residual_depthwise(size=16, channels=32)), weights="fp16").save(fp16)
    assert "quant   fp16 weights" in invoke("inspect", fp16).output


def test_dot_has_every_node_and_edge(tmp_path, cnn_file):
    dot = tmp_path / "g.dot"
    result = invoke("inspect", cnn_file, "--dot", dot)
    assert result.exit_code == 0, result.output
    text = dot.read_text()
    graph = ei.convert(cnn_file).graph
    produced = {o for n in graph.nodes for o in n.outputs} | set(graph.input_names)
    edges = sum(1 for n in graph.nodes for i in n.inputs if i in produced) + len(graph.outputs)
    assert text.startswith("digraph") and text.rstrip().endswith("}")
    assert len(re.findall(r"^  n\d+ \[label=", text, re.M)) == len(graph.nodes)
    assert text.count(" -> ") == edges


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_html_is_self_contained_and_draws_every_node(tmp_path, cnn_file):
    page = tmp_path / "g.html"
    result = invoke("inspect", cnn_file, "--html", page)
    assert result.exit_code == 0, result.output
    parser = _Collector()
    parser.feed(page.read_text())
    graph = ei.convert(cnn_file).graph
    nodes = [attrs for tag, attrs in parser.tags if tag == "g" and attrs.get("class") == "node"]
    assert len(nodes) == len(graph.nodes)
    for tag, attrs in parser.tags:  # nothing fetched from anywhere
        assert "src" not in attrs and not (tag == "link" and "href" in attrs), (tag, attrs)


def test_layers_put_every_node_below_what_it_reads():
    graph = ei.convert(zoo.inception_net(size=16, blocks=1, width=8, classes=5)).graph
    level = graphview.layers(graph)
    producer = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name in producer:
                assert level[index] > level[producer[name]]


@pytest.mark.parametrize("option, name", [("--dot", "g.png"), ("--html", "g.txt")])
def test_wrong_suffix_is_a_one_line_error(tmp_path, cnn_file, option, name):
    result = invoke("inspect", cnn_file, option, tmp_path / name)
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "expected a path ending in" in result.output
