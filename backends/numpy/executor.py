"""Compile an IR graph into a list of numpy steps, then run it many times.

Compile resolves every node to a kernel once (``KERNELS``, versioned by the graph's opset,
else an ``onnx.reference`` fallback), binds its attributes, and plans memory from liveness:
each intermediate is dropped right after its last use, so peak memory is the largest live
set, not the sum of all tensors. ``run`` is a flat loop over prepared steps.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgeinfer.backend import Backend, CompileOptions, Executable
from edgeinfer.backends.numpy.fallback import ReferenceNode, reference_supports
from edgeinfer.backends.numpy.registry import KERNELS, KernelContext
from edgeinfer.errors import BackendError, EdgeInferError, UnsupportedOpError
from edgeinfer.ir import Graph, Node, dtypes


def _opset_for(node: Node, graph: Graph) -> int:
    return graph.opset.get(node.domain, 1)


def _accepted_keywords(fn: Callable) -> tuple[set[str], bool, bool]:
    """(keyword names, accepts **kwargs, wants _ctx) of a kernel."""
    params = inspect.signature(fn).parameters.values()
    keywords = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    return keywords, var_kw, "_ctx" in keywords


def _np_dtype(name: str | None):
    if name is None or not dtypes.is_tensor_type(name):
        return None
    try:
        return dtypes.numpy_dtype(name)
    except EdgeInferError:
        return None


# Ops that must run on every call even with constant inputs (their results differ per run).
_RUN_EVERY_TIME = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                             "Multinomial", "Bernoulli", "Dropout"})


class Step:
    __slots__ = ("node", "call", "inputs", "outputs", "produced", "free", "fallback", "sequence_output")

    def __init__(self, node: Node, call: Callable, inputs: list[str], outputs: list[str], fallback: bool,
                 sequence_output: bool = False):
        self.node, self.call, self.inputs, self.outputs = node, call, inputs, outputs
        self.produced = [o for o in outputs if o]
        self.free: list[str] = []
        self.fallback = fallback
        # a single output of sequence type: a returned list is that one value, not several outputs
        self.sequence_output = sequence_output


def _bind_kernel(node: Node, graph: Graph, fn: Callable) -> Callable[[dict], Any]:
    keywords, var_kw, wants_ctx = _accepted_keywords(fn)
    unknown = [k for k in node.attrs if k not in keywords and not var_kw]
    if unknown:
        raise UnsupportedOpError(f"{node.label}: attribute(s) {', '.join(unknown)} not supported by the "
                                 "numpy kernel")
    attrs = dict(node.attrs)
    if wants_ctx:
        out_values = [graph.values.get(o) for o in node.outputs]
        attrs["_ctx"] = KernelContext(
            op_type=node.op_type, name=node.name, opset=_opset_for(node, graph),
            num_outputs=len(node.outputs),
            output_dtypes=tuple(_np_dtype(v.dtype) if v else None for v in out_values),
            output_shapes=tuple(v.shape if v else None for v in out_values),
            input_dtypes=tuple(_np_dtype(graph.values[i].dtype) if i else None for i in node.inputs))
    names = list(node.inputs)
    while names and not names[-1]:
        names.pop()  # trailing omitted inputs: let the kernel's defaults apply

    def call(values: dict) -> Any:
        return fn(*[values[n] if n else None for n in names], **attrs)

    return call


class NumpyExecutable(Executable):
    thread_safe = True  # all per-run state lives in run()'s locals

    def __init__(self, graph: Graph, options: CompileOptions):
        super().__init__(graph)
        self.options = options
        self.constants = dict(graph.initializers)
        self.steps: list[Step] = []
        self.fallback_ops: dict[str, int] = {}
        for node in graph.nodes:
            fn = KERNELS.lookup(node.op_type, domain=node.domain, version=_opset_for(node, graph))
            if fn is not None:
                call, fallback = _bind_kernel(node, graph, fn), False
            else:
                reason = reference_supports(node, graph.opset)
                if reason is not None:
                    raise UnsupportedOpError(f"{node.label} at opset {_opset_for(node, graph)}: {reason}")
                ref = ReferenceNode(node, graph)
                call, fallback = ref, True
                self.fallback_ops[node.op_type] = self.fallback_ops.get(node.op_type, 0) + 1
            extra = [n for n in (ref.extra_inputs if fallback else []) if n]
            single_sequence = (not fallback and len(node.outputs) == 1 and bool(node.outputs[0])
                               and "sequence(" in (graph.values[node.outputs[0]].dtype or ""))
            self.steps.append(Step(node, call, [i for i in node.inputs if i] + extra,
                                   list(node.outputs), fallback, single_sequence))
        self._precompute_constants()
        self._plan_memory()
        self._produced = frozenset(o for step in self.steps for o in step.outputs if o)
        self._limiter = _thread_limiter(options.threads)
        self._last_stats: dict[str, Any] = {}

    def _precompute_constants(self) -> None:
        """Run once, now, every step whose inputs are all constants (e.g. the Cast that widens
        fp16-stored weights): their results join the constants and the steps leave the plan."""
        remaining = []
        for step in self.steps:
            node = step.node
            if (all(n in self.constants for n in step.inputs) and not node.subgraphs()
                    and node.op_type not in _RUN_EVERY_TIME and not node.domain):
                result = step.call(self.constants)
                result = (result,) if not isinstance(result, (tuple, list)) or step.sequence_output else result
                names = step.produced if step.fallback else step.outputs
                if len(result) >= len(names) and all(isinstance(r, np.ndarray) or np.isscalar(r) for r in result):
                    self.constants.update({n: np.asarray(r) for n, r in zip(names, result) if n})
                    continue
            remaining.append(step)
        self.steps = remaining

    def _plan_memory(self) -> None:
        keep = set(self.output_names) | set(self.constants)
        last_use: dict[str, int] = {}
        for index, step in enumerate(self.steps):
            for name in step.inputs:
                last_use[name] = index
            for name in step.outputs:
                last_use.setdefault(name, index)  # produced but never read: free at once
        for name, index in last_use.items():
            if name not in keep:
                self.steps[index].free.append(name)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._limiter():
            return self._run(feeds)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values: dict[str, Any] = dict(self.constants)
        values.update(feeds)
        live = peak = 0
        produced = self._produced
        timings = [] if self.options.debug else None
        for step in self.steps:
            start = time.perf_counter() if timings is not None else 0.0
            try:
                result = step.call(values)
            except EdgeInferError:
                raise
            except Exception as exc:
                shapes = [getattr(values.get(n), "shape", None) for n in step.inputs]
                raise BackendError(f"{step.node.label} failed on inputs of shapes {shapes}: "
                                   f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(result, (tuple, list)) or step.sequence_output:
                result = (result,)
            names = step.produced if step.fallback else step.outputs  # reference skips omitted outputs
            if len(result) < len(names):
                raise BackendError(f"{step.node.label}: kernel returned {len(result)} outputs, "
                                   f"expected {len(names)}")
            for name, array in zip(names, result):
                if name:
                    if isinstance(array, np.generic):
                        array = np.asarray(array)
                    values[name] = array
                    live += getattr(array, "nbytes", 0)
            peak = max(peak, live)
            if timings is not None:
                timings.append((step.node.label, time.perf_counter() - start,
                                [getattr(values.get(o), "shape", None) for o in step.outputs if o]))
            for name in step.free:
                array = values.pop(name, None)
                if name in produced:
                    live -= getattr(array, "nbytes", 0)
        self._last_stats = {"peak_intermediate_bytes": peak, "node_timings": timings}
        return {name: values[name] for name in self.output_names}

    def stats(self) -> dict[str, Any]:
        return {**self._last_stats, "fallback_ops": dict(self.fallback_ops)}


def _thread_limiter(threads: int | None):
    """A context-manager factory that caps BLAS threads during a run (no-op if None)."""
    from contextlib import nullcontext

    if not threads:
        return nullcontext
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()
    return lambda: controller.limit(limits=threads, user_api="blas")


class NumpyBackend(Backend):
    name = "numpy"

    def supports(self, node: Node, graph: Graph) -> str | None:
        if KERNELS.lookup(node.op_type, domain=node.domain, version=_opset_for(node, graph)) is not None:
            return None
        return reference_supports(node, graph.opset)

    def compile(self, graph: Graph, options: CompileOptions | None = None) -> NumpyExecutable:
        try:
            return NumpyExecutable(graph, options or CompileOptions())
        except EdgeInferError:
            raise
        except Exception as exc:
            raise BackendError(f"numpy backend could not compile graph {graph.name!r}: "
                               f"{type(exc).__name__}: {exc}") from exc
