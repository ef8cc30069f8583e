"""Pictures of a graph for ``edgeinfer inspect``: Graphviz dot, and a self-contained HTML page.

The HTML page needs no network and no Graphviz: nodes are placed in layers (a node sits one
layer below the deepest node it reads from), drawn as inline SVG, with a tooltip per node
(attributes, input and output types, weights) and a search box that highlights matching nodes.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from typing import Any

import numpy as np

from edgeinfer.ir import Graph, Node

QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
                 "ConvInteger", "DynamicQuantizeLinear"}


def quantization(graph: Graph) -> str:
    """How the model is quantized: ``"int8 (QDQ: ...)"``, ``"fp16 weights"`` or ``"no (float32)"``."""
    ops = Counter(n.op_type for n in graph.nodes if n.op_type in QUANTIZED_OPS or "Quant" in n.op_type)
    if ops:
        return "int8 (" + ", ".join(f"{op} x{count}" for op, count in ops.most_common()) + ")"
    weight_bytes: Counter = Counter()
    for array in graph.initializers.values():
        if array.dtype != object:
            weight_bytes[str(array.dtype)] += int(array.nbytes)
    most = weight_bytes.most_common(1)[0][0] if weight_bytes else None
    if most == "float16":
        return "fp16 weights"
    return f"no ({most or 'no weights'})"


def _op(node: Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def _type(graph: Graph, name: str) -> str:
    value = graph.values.get(name)
    return value.type_str() if value is not None else "?"


def _attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor {value.dtype}{list(value.shape)}"
    if isinstance(value, Graph):
        return f"graph ({len(value.nodes)} nodes)"
    if isinstance(value, tuple) and value and isinstance(value[0], Graph):
        return f"{len(value)} graphs"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def node_details(graph: Graph, node: Node) -> dict[str, Any]:
    constants = graph.initializers
    return {
        "name": node.name or (node.outputs[0] if node.outputs else ""),
        "op": _op(node),
        "inputs": [f"{n}: {_type(graph, n)}" + (" (weight)" if n in constants else "") for n in node.inputs if n],
        "outputs": [f"{n}: {_type(graph, n)}" for n in node.outputs if n],
        "attributes": {k: _attr(v) for k, v in node.attrs.items()},
    }


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: Graph) -> str:
    """Graphviz dot: one box per node, an ellipse per graph input and output, edges labelled
    with the tensor's type; weights stay inside their node's label (``dot -Tsvg x.dot``)."""
    constants = graph.initializers
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", '
             'fillcolor="#eef3fb", fontname="Helvetica", fontsize=10];', '  edge [fontsize=8, color="#667788"];']
    producer: dict[str, str] = {}
    for value in graph.inputs:
        lines.append(f'  {_quote("in:" + value.name)} [shape=ellipse, fillcolor="#dff0d8", '
                     f"label={_quote(value.name + chr(10) + value.type_str())}];")
        producer[value.name] = "in:" + value.name
    for index, node in enumerate(graph.nodes):
        ident = f"n{index}"
        weights = [n for n in node.inputs if n in constants]
        label = f"{node.name or node.outputs[0]}\n{_op(node)}" + (f"\n{len(weights)} weight(s)" if weights else "")
        lines.append(f"  {ident} [label={_quote(label)}];")
        for name in node.inputs:
            if name in producer:
                lines.append(f"  {_quote(producer[name])} -> {ident} [label={_quote(_type(graph, name))}];")
        for name in node.outputs:
            if name:
                producer[name] = ident
    for value in graph.outputs:
        lines.append(f'  {_quote("out:" + value.name)} [shape=ellipse, fillcolor="#fbe9d0", '
                     f"label={_quote(value.name + chr(10) + value.type_str())}];")
        if value.name in producer:
            lines.append(f"  {_quote(producer[value.name])} -> {_quote('out:' + value.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def layers(graph: Graph) -> list[int]:
    """The layer of each node: 0 for one reading only graph inputs and constants, else one
    more than the deepest node it reads from."""
    depth: dict[str, int] = {}
    result = []
    for node in graph.nodes:
        level = 1 + max((depth[n] for n in node.inputs if n in depth), default=-1)
        result.append(level)
        for name in node.outputs:
            if name:
                depth[name] = level
    return result


_PALETTE = {"Conv": "#cfe2ff", "Gemm": "#cfe2ff", "MatMul": "#cfe2ff", "Relu": "#d1f0d4", "Clip": "#d1f0d4",
            "Add": "#fff1c1", "Mul": "#fff1c1", "Concat": "#f5d5f0", "Reshape": "#e6e6e6", "Transpose": "#e6e6e6",
            "QuantizeLinear": "#ffd6cc", "DequantizeLinear": "#ffd6cc"}
_BOX_W, _BOX_H, _GAP_X, _GAP_Y = 150, 38, 24, 34


def to_html(graph: Graph, *, title: str, summary_lines: list[str]) -> str:
    """A self-contained HTML page: the summary, the graph as an SVG, and a searchable node list."""
    level = layers(graph)
    slots: Counter = Counter()
    boxes = []
    for depth in level:
        boxes.append((slots[depth] * (_BOX_W + _GAP_X) + 10, (depth + 1) * (_BOX_H + _GAP_Y) + 10))
        slots[depth] += 1
    width = max(slots.values(), default=1) * (_BOX_W + _GAP_X) + 20
    height = (max(level, default=0) + 3) * (_BOX_H + _GAP_Y) + 20
    producer = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    edges, shapes = [], []
    for index, node in enumerate(graph.nodes):
        x, y = boxes[index]
        for name in dict.fromkeys(n for n in node.inputs if n in producer):
            px, py = boxes[producer[name]]
            x0, y0, x1, y1 = px + _BOX_W / 2, py + _BOX_H, x + _BOX_W / 2, y
            edges.append(f'<path d="M{x0},{y0} C{x0},{y0 + _GAP_Y} {x1},{y1 - _GAP_Y} {x1},{y1}">'
                         f"<title>{html.escape(name)}: {html.escape(_type(graph, name))}</title></path>")
        details = node_details(graph, node)
        tip = "\n".join([f"{details['name']} ({details['op']})", *("in  " + t for t in details["inputs"]),
                         *("out " + t for t in details["outputs"]),
                         *(f"{k} = {v}" for k, v in details["attributes"].items())])
        label = details["name"] if len(details["name"]) <= 22 else details["name"][:20] + ".."
        color = _PALETTE.get(node.op_type, "#eef3fb")
        shapes.append(f'<g class="node" id="n{index}" data-search="{html.escape((details["name"] + " " + details["op"]).lower())}">'
                      f"<title>{html.escape(tip)}</title>"
                      f'<rect x="{x}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" rx="6" fill="{color}"/>'
                      f'<text x="{x + _BOX_W / 2}" y="{y + 15}" class="op">{html.escape(details["op"])}</text>'
                      f'<text x="{x + _BOX_W / 2}" y="{y + 30}">{html.escape(label)}</text></g>')
    inputs = " &nbsp; ".join(html.escape(f"{v.name}: {v.type_str()}") for v in graph.inputs)
    outputs = " &nbsp; ".join(html.escape(f"{v.name}: {v.type_str()}") for v in graph.outputs)
    rows = "".join(f"<tr><td>{i}</td><td>{html.escape(_op(n))}</td><td>{html.escape(n.name)}</td>"
                   f"<td>{html.escape(', '.join(node_details(graph, n)['outputs']))}</td></tr>"
                   for i, n in enumerate(graph.nodes))
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines)
    return _PAGE.format(title=html.escape(title), summary=summary, inputs=inputs, outputs=outputs, width=width,
                        height=height, edges="".join(edges), shapes="".join(shapes), rows=rows,
                        count=json.dumps(len(graph.nodes)))


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 16px; color: #222; }}
#graph {{ overflow: auto; border: 1px solid #ccc; max-height: 75vh; }}
svg text {{ font-size: 11px; text-anchor: middle; }} svg text.op {{ font-weight: bold; }}
svg path {{ fill: none; stroke: #8899aa; stroke-width: 1.2; }}
svg rect {{ stroke: #557; stroke-width: 1; }} .hit rect {{ stroke: #d22; stroke-width: 3; }}
table {{ border-collapse: collapse; font-size: 12px; }} td {{ border-bottom: 1px solid #eee; padding: 2px 8px; }}
</style></head><body>
<h2>{title}</h2><ul>{summary}</ul>
<p><b>inputs</b> {inputs}<br><b>outputs</b> {outputs}</p>
<p><input id="q" placeholder="search op or name" size="30"> <span id="found"></span></p>
<div id="graph"><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">{edges}{shapes}</svg></div>
<details><summary>all {count} nodes</summary><table>{rows}</table></details>
<script>
document.getElementById("q").addEventListener("input", function (e) {{
  var q = e.target.value.toLowerCase(), n = 0, first = null;
  document.querySelectorAll("g.node").forEach(function (g) {{
    var hit = q && g.dataset.search.indexOf(q) >= 0;
    g.classList.toggle("hit", hit); if (hit) {{ n++; first = first || g; }}
  }});
  document.getElementById("found").textContent = q ? n + " match(es)" : "";
  if (first) first.scrollIntoView({{block: "center", inline: "center"}});
}});
</script></body></html>
"""
