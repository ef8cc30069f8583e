"""Compile an IR graph into a list of numpy steps, then run it many times.

Compile resolves every node to a kernel once (``KERNELS``, versioned by the graph's opset,
else an ``onnx.reference`` fallback), binds its attributes, and plans memory from liveness:
each intermediate is dropped right after its last use, so peak memory is the largest live
set, not the sum of all tensors. ``run`` is a flat loop over prepared steps.

Ops with graph attributes (If, Loop, Scan, SequenceMap) have ``SubgraphKernel``s: built once
per node at compile time, they compile their bodies into ``NumpyExecutable``s of their own
(``compile_subgraph``: the enclosing scope's constants are visible to the body and folded
into it), and on each run call ``evaluate`` on them with the outer-scope values they read.
A value is a numpy array, a list of arrays (a sequence) or None (an empty optional).
"""

from __future__ import annotations

import functools
import inspect
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx

from edgeinfer.backend import Backend, CompileOptions, Executable
from edgeinfer.backends.numpy import parallel
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
    __slots__ = ("node", "call", "inputs", "outputs", "names", "produced", "free", "fallback", "single_value")

    def __init__(self, node: Node, call: Callable, inputs: list[str], outputs: list[str], fallback: bool,
                 single_value: bool = False):
        self.node, self.call, self.inputs, self.outputs = node, call, inputs, outputs
        self.produced = [o for o in outputs if o]
        self.names = self.produced if fallback else outputs  # reference skips omitted outputs
        self.free: list[str] = []
        self.fallback = fallback
        # one output that may be a sequence or optional: a returned list is that one value
        self.single_value = single_value

    def store(self, values: dict, result: Any) -> None:
        """Bind the kernel's result (one value, or a tuple/list of one value per output)."""
        names = self.names
        if not isinstance(result, (tuple, list)) or self.single_value:
            if len(names) == 1:  # the common case, kept short: it runs once per step
                if names[0]:
                    values[names[0]] = np.asarray(result) if isinstance(result, np.generic) else result
                return
            result = (result,)
        if len(result) < len(names):
            raise BackendError(f"{self.node.label}: kernel returned {len(result)} outputs, "
                               f"expected {len(names)}")
        for name, value in zip(names, result):
            if name:
                values[name] = np.asarray(value) if isinstance(value, np.generic) else value

    def failure(self, values: dict, exc: Exception) -> BackendError:
        shapes = [getattr(values.get(n), "shape", None) for n in self.inputs]
        return BackendError(f"{self.node.label} failed on inputs of shapes {shapes}: "
                            f"{type(exc).__name__}: {exc}")


class SubgraphKernel:
    """Base of the kernels of ops with graph attributes (If, Loop, Scan, SequenceMap).

    Registered in ``KERNELS`` like a function kernel, but the executor constructs it once per
    node at compile time, ``Kernel(node, scope)``, where it compiles its bodies with
    ``scope.compile_subgraph`` (once, like the main graph). On each run it is called with the
    enclosing scope's value table (holding the node's inputs and every outer-scope name its
    bodies read) and returns a tuple with one value per output. It keeps no per-run state, so
    an executable stays safe to call from several threads at once.
    """

    def __init__(self, node: Node, scope: NumpyExecutable):
        self.node = node
        self.bodies: list[NumpyExecutable] = []

    def compile(self, scope: NumpyExecutable, attr: str) -> NumpyExecutable:
        body = scope.compile_subgraph(self.node.attrs[attr], f"{self.node.label} attribute {attr!r}")
        self.bodies.append(body)
        return body

    def __call__(self, values: dict) -> tuple:
        raise NotImplementedError

    def body_error(self, exc: EdgeInferError, where: str) -> EdgeInferError:
        """``exc`` (raised inside a body) of the same type, saying which node, body and iteration."""
        return type(exc)(f"{self.node.label} {where}: {exc}")


def _is_subgraph_kernel(fn: Any) -> bool:
    return isinstance(fn, type) and issubclass(fn, SubgraphKernel)


@functools.cache
def _schema_single_container_output(domain: str, op_type: str, version: int) -> bool:
    """True if the op has one output whose type may be a sequence or an optional."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except Exception:  # not an ONNX schema (edgeinfer domain, unknown op)
        return False
    if len(schema.outputs) != 1 or schema.outputs[0].option != onnx.defs.OpSchema.FormalParameterOption.Single:
        return False
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    types = allowed.get(schema.outputs[0].type_str, [schema.outputs[0].type_str])
    return any(t.startswith(("seq(", "optional(")) for t in types)


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

    if len(names) == 1 and names[0]:  # most ops: one input, two inputs; no list to build per call
        only = names[0]
        return lambda values: fn(values[only], **attrs)
    if len(names) == 2 and all(names):
        first, second = names
        return lambda values: fn(values[first], values[second], **attrs)
    return lambda values: fn(*[values[n] if n else None for n in names], **attrs)


class NumpyExecutable(Executable):
    thread_safe = True  # all per-run state lives in run()'s locals

    def __init__(self, graph: Graph, options: CompileOptions, *,
                 outer_constants: Mapping[str, Any] | None = None):
        """``outer_constants``: for a subgraph, the enclosing scopes' constants it reads."""
        super().__init__(graph)
        self.options = options
        self.constants = {**(outer_constants or {}), **graph.initializers}
        self.steps: list[Step] = []
        self.fallback_ops: dict[str, int] = {}
        for node in graph.nodes:
            step = self._compile_node(node, graph)
            if not self._precomputed(step):
                self.steps.append(step)
        self._plan_memory()
        self._produced = frozenset(o for step in self.steps for o in step.outputs if o)
        # a subgraph's feeds: its inputs and the outer-scope values it reads (not constants)
        self.outer_names = sorted(graph.outer_names() - set(self.constants) - set(self.input_names))
        self._limiter = _thread_limiter(options.threads)
        if options.threads:
            parallel.hold_blas()
            weakref.finalize(self, parallel.release_blas)
        self._last_stats: dict[str, Any] = {}

    def _compile_node(self, node: Node, graph: Graph) -> Step:
        version = _opset_for(node, graph)
        fn = KERNELS.lookup(node.op_type, domain=node.domain, version=version)
        outer = sorted(set().union(*(s.outer_names() for s in node.subgraphs())) - set(node.inputs))
        inputs = [i for i in node.inputs if i] + outer
        if _is_subgraph_kernel(fn):
            kernel = fn(node, self)
            for body in kernel.bodies:
                for op, count in body.fallback_ops.items():
                    self.fallback_ops[op] = self.fallback_ops.get(op, 0) + count
            return Step(node, kernel, inputs, list(node.outputs), False)
        if fn is not None:
            single = len(node.outputs) == 1 and bool(node.outputs[0]) and (
                "sequence(" in (graph.values[node.outputs[0]].dtype or "")
                or _schema_single_container_output(node.domain, node.op_type, version))
            return Step(node, _bind_kernel(node, graph, fn), inputs, list(node.outputs), False, single)
        reason = reference_supports(node, graph.opset)
        if reason is not None:
            raise UnsupportedOpError(f"{node.label} at opset {version}: {reason}")
        self.fallback_ops[node.op_type] = self.fallback_ops.get(node.op_type, 0) + 1
        return Step(node, ReferenceNode(node, graph), inputs, list(node.outputs), True)

    def compile_subgraph(self, subgraph: Graph, where: str) -> NumpyExecutable:
        """Compile a body graph of one of this graph's nodes, with this scope's constants visible."""
        reads = subgraph.outer_names()
        visible = {n: a for n, a in self.constants.items() if n in reads}
        try:
            return NumpyExecutable(subgraph, CompileOptions(debug=self.options.debug), outer_constants=visible)
        except EdgeInferError as exc:
            raise type(exc)(f"{where}: {exc}") from exc

    def _precomputed(self, step: Step) -> bool:
        """Run ``step`` once, now, if all its inputs are constants (e.g. the Cast that widens
        fp16-stored weights): its results join the constants and the step leaves the plan."""
        node = step.node
        if (not all(n in self.constants for n in step.inputs) or node.subgraphs()
                or node.op_type in _RUN_EVERY_TIME or node.domain):
            return False
        result = step.call(self.constants)
        result = (result,) if not isinstance(result, (tuple, list)) or step.single_value else result
        # sequences and optionals (lists, None) are built on every run
        if len(result) < len(step.names) or not all(isinstance(r, np.ndarray) or np.isscalar(r) for r in result):
            return False
        self.constants.update({n: np.asarray(r) for n, r in zip(step.names, result) if n})
        return True

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
        produced = self._produced
        live = peak = 0
        timings = [] if self.options.debug else None
        clock = time.perf_counter()

        def account(step: Step, values: dict) -> None:  # after each step, before its frees
            nonlocal live, peak, clock
            live += sum(getattr(values[name], "nbytes", 0) for name in step.produced)
            peak = max(peak, live)
            live -= sum(getattr(values.get(name), "nbytes", 0) for name in step.free if name in produced)
            if timings is not None:
                now = time.perf_counter()
                timings.append((step.node.label, now - clock,
                                [getattr(values.get(o), "shape", None) for o in step.outputs if o]))
                clock = now

        self._execute(values, account)
        self._last_stats = {"peak_intermediate_bytes": peak, "node_timings": timings}
        return {name: values[name] for name in self.output_names}

    def evaluate(self, feeds: dict[str, Any]) -> list[Any]:
        """Run as a subgraph: ``feeds`` hold its inputs and ``outer_names``; returns its outputs
        in order. A body runs once per iteration, so this path keeps no stats and takes no
        thread limit (the enclosing run holds it)."""
        values = {**self.constants, **feeds}
        self._execute(values)
        return [values[name] for name in self.output_names]

    def _execute(self, values: dict[str, Any], on_step: Callable[[Step, dict], None] | None = None) -> None:
        """The flat step loop: run each step on ``values``, bind its outputs, drop dead values."""
        for step in self.steps:
            try:
                result = step.call(values)
            except EdgeInferError:
                raise
            except Exception as exc:
                raise step.failure(values, exc) from exc
            step.store(values, result)
            if on_step is not None:
                on_step(step, values)
            for name in step.free:
                values.pop(name, None)

    def stats(self) -> dict[str, Any]:
        return {**self._last_stats, "fallback_ops": dict(self.fallback_ops)}

    def close(self) -> None:
        self.constants = {}  # folded and converted constants (the graph's own stay with the model)
        self.steps = []


def _thread_limiter(threads: int | None):
    """A context-manager factory for a run's threads (no-op if None): BLAS gets one thread and
    kernels share their work between ``threads`` workers (``parallel``), which keeps going when
    a thread is descheduled on a busy machine where BLAS's own threads wait for each other."""
    from contextlib import nullcontext

    if not threads:
        return nullcontext
    return lambda: parallel.RunThreads(threads)


class NumpyBackend(Backend):
    name = "numpy"

    def supports(self, node: Node, graph: Graph) -> str | None:
        if KERNELS.lookup(node.op_type, domain=node.domain, version=_opset_for(node, graph)) is None:
            return reference_supports(node, graph.opset)
        for body in node.subgraphs():
            for inner in body.nodes:
                reason = self.supports(inner, body)
                if reason is not None:
                    return f"{inner.label} in a subgraph: {reason}"
        return None

    def compile(self, graph: Graph, options: CompileOptions | None = None) -> NumpyExecutable:
        try:
            return NumpyExecutable(graph, options or CompileOptions())
        except EdgeInferError:
            raise
        except Exception as exc:
            raise BackendError(f"numpy backend could not compile graph {graph.name!r}: "
                               f"{type(exc).__name__}: {exc}") from exc
