"""The tflite backend: export a graph with ``edgeinfer.format.tflite`` once, keep one interpreter.

``supports`` is the exporter's own per-node check (an op without an export rule, or with
attributes TFLite cannot express, stays on another backend). ``compile`` writes the
flatbuffer in memory and builds the interpreter (XNNPACK by default, or a delegate library)
and, for static input shapes, invokes it once on zeros so that what XNNPACK refuses at its
first invocation fails here, where the scheduler can still place the part elsewhere;
``run`` resizes the inputs when a dynamic dim changes, invokes, and returns copies of the
outputs.
"""

from __future__ import annotations

import functools
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edgeinfer.backend import Artifact, Backend, CompileOptions, Executable, check_option_names
from edgeinfer.backends.common import first_line, merged_options, missing_device, refuse_unsupported
from edgeinfer.engine_logs import native_info_quiet
from edgeinfer.errors import BackendError, EdgeInferError
from edgeinfer.ir import Graph, Node
from edgeinfer.log import get_logger

ENGINE_OPTIONS = ("op_resolver", "delegate", "delegate_options")
ARTIFACT_KIND = "tflite"  # the ahead-of-time form: the exported flatbuffer
OP_RESOLVERS = {"auto": "AUTO", "builtin": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "reference": "BUILTIN_REF"}
log = get_logger("edgeinfer.backends.tflite")


@functools.cache
def runtime() -> Any:
    """The interpreter module: ``ai_edge_litert.interpreter`` (preferred) or ``tflite_runtime.interpreter``."""
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter
        except ImportError as exc:
            raise ImportError("no TFLite runtime: expected ai_edge_litert or tflite_runtime to be installed "
                              "(pip install 'edgeinfer[tflite]')") from exc
    return interpreter




class _Public:
    """The interpreter's public methods under its wrapper's names (a runtime without ``_interpreter``)."""

    def __init__(self, interpreter: Any):
        self.SetTensor, self.Invoke = interpreter.set_tensor, interpreter.invoke
        self.GetTensor = lambda index, subgraph: interpreter.get_tensor(index, subgraph)


def _engine(interpreter: Any) -> Any:
    """What runs ``interpreter`` per request: its native wrapper (``_interpreter``). The public
    ``set_tensor`` / ``invoke`` / ``get_tensor`` are Python frames over it, and ``invoke`` first
    counts references to refuse a run while a ``tensor()`` view is alive; this executable never
    takes such views, and the three frames are 3 us of a 6 us wake-word head
    (``openwakeword/hey_rhasspy``: LiteRT direct 6.2 us; this executable 9.1 us before, 8.6 us now)."""
    return getattr(interpreter, "_interpreter", None) or _Public(interpreter)


class TFLiteExecutable(Executable):
    """Idle interpreters per shape signature of the inputs (at most ``SHAPES_KEPT`` signatures,
    the oldest dropped first). A TFLite interpreter runs one invocation at a time,
    so a call takes an idle interpreter of its shapes and gives it back: calls from several
    threads at once each get their own (another one is made from the same flatbuffer when all
    are busy), which makes the executable thread safe on the CPU. A graph with dynamic dims
    gets a fresh interpreter sized to each new signature before its first allocation: XNNPACK
    plans a delegated subgraph for the shapes it is prepared with, and resizing one planned at
    the flatbuffer's placeholder dims (1 for a symbolic H or W, too small for a 3x3 conv) fails
    ("XNNPack delegate failed to reshape"); a kept interpreter also saves re-planning when sizes
    alternate. With a delegate (which may hold a device context) there is one interpreter,
    resized in place, and the executable is neither thread safe nor movable between threads."""

    SHAPES_KEPT = 8

    def __init__(self, graph: Graph, interpreter: Any, flatbuffer: bytes, facts: Mapping[str, Any],
                 make_interpreter: Callable[[], Any] | None = None):
        super().__init__(graph)
        self.flatbuffer = flatbuffer  # the interpreters read the model from this buffer; keep it alive
        self._facts = dict(facts)
        self._make = make_interpreter
        self.thread_safe = make_interpreter is not None
        self.thread_affine = not self.thread_safe
        details = interpreter.get_input_details()
        self._inputs = [d["index"] for d in details]
        self._outputs = [d["index"] for d in interpreter.get_output_details()]
        self._interpreters = 1
        self._one = interpreter  # resized in place where no factory makes others
        self._idle: OrderedDict[tuple, list[Any]] = OrderedDict()  # shapes -> idle interpreters
        self._feeds = list(zip(self._inputs, self.input_names))
        self._results = list(zip(self.output_names, self._outputs))
        # a graph of fixed input shapes: idle native engines in one list, more made when every one is
        # busy (their interpreters kept alive in ``_kept``); the engine checks each feed's shape and
        # dtype itself and copies a strided array, so a request costs a pop, the engine's three
        # calls and an append (openwakeword/hey_rhasspy, one thread, ``bench_tflite_native.py``: the
        # tflite backend 1.11x LiteRT on the original file, 1.07x by fastest calls; the shape-keyed
        # shelf stays for dynamic dims)
        self._static: list[Any] | None = None
        self._kept = [interpreter]
        if facts.get("allocated", True):
            self._idle[tuple(tuple(int(n) for n in d["shape"]) for d in details)] = [interpreter]
            if not _has_dynamic_inputs(graph):
                self._static = [_engine(interpreter)]

    def _interpreter_for(self, shapes: tuple) -> Any:
        """An interpreter allocated for ``shapes`` (none of that size is idle)."""
        if self._make is not None:
            interpreter = self._make()
            self._interpreters += 1
        else:  # the one interpreter is resized in place (and no longer holds its old shapes)
            interpreter = self._one
            self._idle.clear()
        for index, shape in zip(self._inputs, shapes, strict=True):
            interpreter.resize_tensor_input(index, shape, strict=False)
        with native_info_quiet():  # XNNPACK announces itself when it first prepares the graph
            interpreter.allocate_tensors()
        return interpreter

    def _shelf(self, shapes: tuple) -> list[Any]:
        """The idle list of ``shapes``, made (and the oldest signatures dropped) if it is new."""
        shelf = self._idle.setdefault(shapes, [])
        while len(self._idle) > self.SHAPES_KEPT:
            self._idle.popitem(last=False)
        return shelf

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        idle = self._static
        if idle is None:
            return self._run_sized(feeds)
        try:
            engine = idle.pop()
        except IndexError:  # every engine busy on another thread
            engine = self._another()
            if engine is None:
                return self._run_sized(feeds)
        try:
            for index, name in self._feeds:
                engine.SetTensor(index, feeds[name])
            engine.Invoke()
            return {name: engine.GetTensor(index, 0) for name, index in self._results}  # copies: the engine goes back
        except ValueError:  # another shape (or dtype): sized for it, or refused in one line
            return self._run_sized(feeds)
        except RuntimeError as exc:
            raise self._failed(feeds, exc) from exc
        finally:
            idle.append(engine)

    def _another(self) -> Any:
        """One more engine of the fixed shapes (None with a delegate's single interpreter)."""
        if self._make is None:
            return None
        interpreter = self._make()
        with native_info_quiet():
            interpreter.allocate_tensors()
        self._kept.append(interpreter)
        self._interpreters += 1
        return _engine(interpreter)

    def _run_sized(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A run on an interpreter sized for the feeds' shapes (made or resized where none is idle)."""
        arrays = [np.ascontiguousarray(feeds[name]) for name in self.input_names]
        shapes = tuple([array.shape for array in arrays])
        idle = self._idle.get(shapes)
        try:
            interpreter = idle.pop() if idle else self._interpreter_for(shapes)
        except IndexError:  # another thread took the last idle one meanwhile
            interpreter = self._interpreter_for(shapes)
        except (RuntimeError, ValueError) as exc:
            raise self._failed(feeds, exc) from exc
        engine = _engine(interpreter)
        try:
            for index, array in zip(self._inputs, arrays):
                engine.SetTensor(index, array)
            engine.Invoke()
            results = [engine.GetTensor(index, 0) for index in self._outputs]  # copies: the interpreter goes back
        except (RuntimeError, ValueError) as exc:
            raise self._failed(feeds, exc) from exc
        finally:
            (idle if idle is not None else self._shelf(shapes)).append(interpreter)
        return dict(zip(self.output_names, results))

    def _failed(self, feeds: Mapping[str, Any], exc: Exception) -> BackendError:
        shapes = {name: getattr(array, "shape", None) for name, array in feeds.items()}
        return BackendError(f"the TFLite interpreter failed to run graph {self.graph.name!r} with inputs "
                            f"{shapes}: {first_line(exc)}")

    def artifact(self, source: Graph) -> Artifact:
        """The flatbuffer it runs: loaded with no export (and no import of the exporter)."""
        return Artifact(ARTIFACT_KIND, self.flatbuffer)

    def stats(self) -> dict[str, Any]:
        return {**{k: v for k, v in self._facts.items() if k != "allocated"}, "shape_signatures": len(self._idle),
                "interpreters": self._interpreters}

    def close(self) -> None:
        self._idle = OrderedDict()  # the interpreters go before the buffer they read the model from
        self._static, self._kept, self._one = None, [], None
        self.flatbuffer = b""


class TFLiteBackend(Backend):
    name = "tflite"

    def __init__(self, *, device: str = "cpu", fallback: bool = False, **engine_options: Any):
        self.engine_options = _check_engine_options(engine_options)
        self.device = device
        if device != "cpu" and not self.engine_options.get("delegate"):
            message = (f"tflite backend: device {device!r} needs a delegate library (engine option delegate=PATH, "
                       "e.g. libtensorflowlite_gpu_delegate.so or libedgetpu.so.1); found none")
            missing_device(message, fallback, log, "falling back to the CPU (XNNPACK)")
            self.device = "cpu"
        if self.engine_options.get("delegate"):
            try:
                self._load_delegate(self.engine_options)
            except BackendError:
                if not fallback:
                    raise
                log.warning("tflite backend: delegate %r cannot be loaded; falling back to the CPU",
                            self.engine_options["delegate"])
                self.engine_options.pop("delegate")
                self.engine_options.pop("delegate_options", None)
                self.device = "cpu"

    def supports(self, node: Node, graph: Graph) -> str | None:
        from edgeinfer.format.tflite import node_support

        return node_support(node, graph)

    def engine_version(self) -> str:
        return _engine_version()

    def compile(self, graph: Graph, options: CompileOptions | None = None) -> TFLiteExecutable:
        options = options or CompileOptions()
        engine = merged_options(self.engine_options, options.engine_options, _check_engine_options)
        if options.threads is not None and (not isinstance(options.threads, int) or options.threads < 1):
            raise BackendError(f"tflite backend: threads must be a positive integer, got {options.threads!r}")
        if options.artifact is not None and options.artifact.kind == ARTIFACT_KIND:
            flatbuffer = bytes(options.artifact.data)  # exported ahead of time (``edgeinfer compile``)
        else:
            flatbuffer = self._export(graph)
        module = runtime()
        resolver = engine.get("op_resolver", "auto")
        delegates = [self._load_delegate(engine)] if engine.get("delegate") else None

        def make_interpreter() -> Any:
            with native_info_quiet():  # "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
                return module.Interpreter(
                    model_content=flatbuffer, num_threads=options.threads, experimental_delegates=delegates,
                    experimental_op_resolver_type=getattr(module.OpResolverType, OP_RESOLVERS[resolver]))

        dynamic = _has_dynamic_inputs(graph)
        try:
            interpreter = make_interpreter()
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"the TFLite interpreter could not load graph {graph.name!r}: {first_line(exc)}") from exc
        allocated = True
        try:
            with native_info_quiet():
                interpreter.allocate_tensors()
        except (RuntimeError, ValueError) as exc:
            if not dynamic:
                raise BackendError(f"the TFLite interpreter could not load graph {graph.name!r}: "
                                   f"{first_line(exc)}") from exc
            # the placeholder dims of a dynamic input are no request; each real shape gets its own
            allocated = False
        if not dynamic and options.artifact is None:  # a stored flatbuffer was probed when it was compiled
            _probe(interpreter, graph)
        facts = {"runtime": module.__name__, "op_resolver": resolver, "delegate": engine.get("delegate"),
                 "num_threads": options.threads, "flatbuffer_bytes": len(flatbuffer), "allocated": allocated}
        # a delegate library is loaded once (its handle shared by interpreters) and may hold one
        # device context: one interpreter then, a graph with dynamic dims resizing it in place
        factory = make_interpreter if not delegates else None
        if options.artifact is not None:
            _check_names(interpreter, graph)
        return TFLiteExecutable(graph, interpreter, flatbuffer, facts, factory)

    def _export(self, graph: Graph) -> bytes:
        from edgeinfer.format.tflite import export_tflite

        refuse_unsupported("tflite", graph.name, self.unsupported(graph))
        try:
            return export_tflite(graph)
        except EdgeInferError as exc:
            raise BackendError(f"tflite backend: graph {graph.name!r} cannot be exported: {exc}") from exc

    @staticmethod
    def _load_delegate(engine: Mapping[str, Any]) -> Any:
        path = str(engine["delegate"])
        try:
            return runtime().load_delegate(path, dict(engine.get("delegate_options") or {}))
        except (ValueError, OSError, RuntimeError) as exc:
            raise BackendError(f"tflite backend: delegate library {path!r} cannot be loaded: "
                               f"{first_line(exc)}") from exc


@functools.cache
def _engine_version() -> str:
    """The interpreter package and its version (its ``__version__``: no metadata scan at load)."""
    module = runtime()
    package = module.__name__.split(".")[0]
    version = getattr(sys.modules.get(package), "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(package.replace("_", "-"))
        except metadata.PackageNotFoundError:
            version = "?"
    return f"{package} {version}"


def _check_names(interpreter: Any, graph: Graph) -> None:
    """A stored flatbuffer must take and give as many tensors as this part (the runtime bound it
    to the part by its input and output names; the exporter may rename a tensor whose layout it
    changed, so the names here are the flatbuffer's own)."""
    inputs = [d["name"] for d in interpreter.get_input_details()]
    outputs = [d["name"] for d in interpreter.get_output_details()]
    if len(inputs) != len(graph.input_names) or len(outputs) != len(graph.output_names):
        raise BackendError(f"the flatbuffer stored for graph {graph.name!r} takes {inputs} and gives {outputs}: "
                           f"expected {len(graph.input_names)} input(s) and {len(graph.output_names)} output(s) "
                           "(a flatbuffer of another part)")


def _has_dynamic_inputs(graph: Graph) -> bool:
    return any(value.shape is None or any(not isinstance(d, int) or d < 0 for d in value.shape)
               for value in graph.inputs)


def _probe(interpreter: Any, graph: Graph) -> None:
    """One invocation on zeros (then ones) at compile time, where the input shapes are static: XNNPACK
    plans (and may refuse, "failed to reshape") at the first invoke, so a part that compiles
    here does not fail on its first request (the scheduler moves a part that fails to compile
    to another backend; one that fails later is an error)."""
    details = interpreter.get_input_details()
    if any(int(d) < 0 for detail in details for d in detail.get("shape_signature", detail["shape"])):
        return  # dynamic dims: planned per shape at run time
    if any(np.dtype(detail["dtype"]).kind not in "biuf" for detail in details):
        return  # string inputs: zeros are no valid request
    failures: list[Exception] = []
    for fill in (np.zeros, np.ones):  # ones where zeros are no valid request (an integer divisor)
        try:
            for detail in details:
                interpreter.set_tensor(detail["index"], fill(detail["shape"], detail["dtype"]))
            with native_info_quiet():
                interpreter.invoke()
            return
        except (RuntimeError, ValueError) as exc:
            failures.append(exc)
    raise BackendError(f"the TFLite interpreter could not run graph {graph.name!r} (probed with zeros "
                       f"when compiled): {first_line(failures[0])}") from failures[0]


def _check_engine_options(engine_options: Mapping[str, Any]) -> dict[str, Any]:
    engine_options = check_option_names("tflite", engine_options, ENGINE_OPTIONS)
    resolver = engine_options.get("op_resolver")
    if resolver is not None and resolver not in OP_RESOLVERS:
        raise BackendError(f"tflite backend: op_resolver {resolver!r}: expected one of {list(OP_RESOLVERS)}")
    options = engine_options.get("delegate_options")
    if options is not None and not isinstance(options, Mapping):
        raise BackendError(f"tflite backend: delegate_options must be a dict, got {type(options).__name__}")
    return dict(engine_options)
