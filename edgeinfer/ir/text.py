"""A readable text dump of a graph (``str(graph)``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeinfer.ir.graph import Graph


def _attr_text(value: Any) -> str:
    if isinstance(value, Graph):
        return f"<graph {value.name}: {len(value.nodes)} nodes>"
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"tensor<{value.dtype}>{value.tolist()}"
        return f"tensor<{value.dtype}{list(value.shape)}>"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_attr_text(v) for v in value) + "]"
    return repr(value)


def format_graph(graph: Graph, indent: str = "") -> str:
    opsets = ", ".join(f"{domain or 'ai.onnx'}={version}" for domain, version in sorted(graph.opset.items()))
    lines = [f"{indent}graph {graph.name} (opset {opsets}) {{"]
    for value in graph.inputs:
        lines.append(f"{indent}  input  {value.name}: {value.type_str()}")
    for name, value in graph.values.items():
        if value.const is not None and name not in graph.input_names:
            lines.append(f"{indent}  const  {name}: {value.type_str()}")
    for node in graph.nodes:
        outs = ", ".join(f"{o}: {graph.values[o].type_str()}" if o else "_" for o in node.outputs)
        ins = ", ".join(i or "_" for i in node.inputs)
        op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        attrs = ", ".join(f"{k}={_attr_text(v)}" for k, v in sorted(node.attrs.items()))
        lines.append(f"{indent}  {outs} = {op}({ins}){' {' + attrs + '}' if attrs else ''}")
        for sub in node.subgraphs():
            lines.append(format_graph(sub, indent + "    "))
    for value in graph.outputs:
        lines.append(f"{indent}  output {value.name}: {value.type_str()}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)
