"""What onnxruntime's CPU provider has kernels for: the registry the engine itself reports.

``get_all_opkernel_def()`` lists every kernel the installed onnxruntime build registered:
provider, domain, op, the op versions it covers and the element types of each type constraint.
A node is taken only where a CPU kernel covers the version of the op's schema at the graph's
opset and every typed input and output of the node is among that kernel's types, so the claim
is the engine's own (onnxruntime's GetCapability answers from the same registry). Without it
(a build that does not export the registry) nothing is refused here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

import onnx

from edgeinfer.ir import Graph, Node, dtypes

log = logging.getLogger("edgeinfer.backends.onnxruntime.kernels")
CPU = "CPUExecutionProvider"
Kernel = tuple[int, int, Mapping[str, frozenset[str]]]  # first version, last version, constraint -> types
OPEN = 2**31 - 1  # the last version of a kernel registered for an op's version and every later one


@functools.lru_cache(maxsize=1)
def cpu_kernels() -> dict[tuple[str, str], list[Kernel]] | None:
    """(domain, op) -> the CPU kernels registered for it; None where the build does not say."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        defs = state.get_all_opkernel_def()
    except (ImportError, AttributeError, RuntimeError) as exc:
        log.debug("onnxruntime's kernel registry is unavailable (%s): kernels are not checked", exc)
        return None
    table: dict[tuple[str, str], list[Kernel]] = {}
    for kernel in defs:
        if kernel.provider != CPU:
            continue
        first, last = kernel.version_range
        types = {name: frozenset(values) for name, values in kernel.type_constraints.items()}
        table.setdefault((_domain(kernel.domain), kernel.op_name), []).append((first, last, types))
    return table


def kernel_reason(node: Node, graph: Graph) -> str | None:
    """None if a CPU kernel of this onnxruntime runs ``node`` at the graph's opset, else why not."""
    table = cpu_kernels()
    if table is None:
        return None
    domain = _domain(node.domain)
    kernels = table.get((domain, node.op_type))
    if not kernels:
        return f"onnxruntime {_version()} has no CPU kernel for {node.op_type}"
    opset = graph.opset.get(node.domain, graph.opset.get(domain, onnx.defs.onnx_opset_version()))
    try:
        schema = onnx.defs.get_schema(node.op_type, max_inclusive_version=opset, domain=node.domain)
    except onnx.defs.SchemaError:
        return None  # schema_reason says why
    since = schema.since_version
    # onnxruntime's own rule (KernelRegistry::VerifyKernelDef): an open-ended kernel serves the op
    # version it starts at, a closed range every version in it
    covering = [k for k in kernels if k[0] == since or (k[0] < since <= k[1] and k[1] != OPEN)]
    if not covering:
        ranges = ", ".join(sorted({f"{a}-{b}" if b != OPEN else str(a) for a, b, _ in kernels}))
        return f"onnxruntime {_version()} has no CPU kernel for {node.op_type} version {since} (only {ranges})"
    if node.op_type in ("RNN", "GRU", "LSTM") and node.attrs.get("layout", 0) == 1:
        return f"onnxruntime's CPU {node.op_type} takes layout 0 only (batch second), found layout=1"
    typed = _typed(node, graph, schema)
    for _, _, constraints in covering:
        if all(kind in constraints[name] for name, kind in typed if name in constraints):
            return None
    shown = ", ".join(sorted({kind for _, kind in typed}))
    return f"onnxruntime {_version()} has no CPU kernel for {node.op_type}({since}) on {shown}"


def _typed(node: Node, graph: Graph, schema: onnx.defs.OpSchema) -> list[tuple[str, str]]:
    """(type constraint, onnxruntime's type string) of each typed input and output of ``node``."""
    found = []
    for formals, names in ((schema.inputs, node.inputs), (schema.outputs, node.outputs)):
        if not formals:
            continue
        for position, name in enumerate(names):
            formal = formals[min(position, len(formals) - 1)]  # a variadic last formal takes the rest
            value = graph.values.get(name) if name else None
            if value is None or not dtypes.is_tensor_type(value.dtype):
                continue
            found.append((formal.type_str, f"tensor({onnx.TensorProto.DataType.Name(dtypes.to_onnx(value.dtype)).lower()})"))
    return found


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@functools.lru_cache(maxsize=1)
def _version() -> str:
    import onnxruntime

    return onnxruntime.__version__
