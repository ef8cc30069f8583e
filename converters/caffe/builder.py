"""Build an IR graph from Caffe layers: the rule registry and the per-layer context.

A rule is one function per Caffe layer type, registered with ``@layer("Convolution")``. It
reads the layer through a ``LayerContext`` (parameters, bottom shapes, blobs) and emits ONNX
ops (opset ``OPSET``) with ``ctx.node``; it never looks at other layers. The builder owns
the naming: Caffe blobs may be rewritten in place (top == bottom), IR values may not, so each
version of a blob gets its own value and the last version takes the blob's own name.
Shapes of every value are inferred layer by layer (Caffe nets are static), so rules can use
their bottoms' shapes (pooling's output size, PriorBox, Crop, Slice).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgeinfer.converters.caffe.caffemodel import LayerWeights
from edgeinfer.converters.caffe.prototxt import LayerSpec
from edgeinfer.errors import ConversionError, ModelFormatError, UnsupportedOpError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.graph import EDGEINFER_DOMAIN
from edgeinfer.ir.infer import infer_types
from edgeinfer.ir.names import fresh_name
from edgeinfer.ir.onnx_io import EDGEINFER_OPSET_VERSION
from edgeinfer.limits import MAX_TENSOR_ELEMENTS
from edgeinfer.registry import OpRegistry

OPSET = 17
LayerRule = Callable[["LayerContext"], None]
LAYERS: OpRegistry[LayerRule] = OpRegistry("Caffe layer converter")


def layer(*types: str) -> Callable[[LayerRule], LayerRule]:
    """Register a rule for one or more Caffe layer types."""
    return LAYERS.decorator(types)


_TRAINING_ONLY = {"Data", "ImageData", "HDF5Data", "HDF5Output", "MemoryData", "WindowData", "DummyData",
                  "AnnotatedData", "Python", "SoftmaxWithLoss", "EuclideanLoss", "HingeLoss", "InfogainLoss",
                  "MultinomialLogisticLoss", "SigmoidCrossEntropyLoss", "ContrastiveLoss", "Accuracy",
                  "MultiBoxLoss"}
_TRAINING_ONLY_HINT = ("a data, loss or accuracy layer of a training net: convert the deploy prototxt, or "
                       "declare the inputs with input:/input_shape instead of data layers")


class RandomWeightsWarning(UserWarning):
    """A net was converted without a caffemodel: its weights are random placeholders."""


class Blob:
    """What a rule expects of one parameter blob: its shape and, for conversions without
    weights, how to fill it (``"random"``, or a constant)."""

    __slots__ = ("shape", "fill")

    def __init__(self, shape: Sequence[int], fill: str | float = "random"):
        self.shape = tuple(int(d) for d in shape)
        self.fill = fill


class NetBuilder:
    def __init__(self, inputs: Sequence[tuple[str, tuple[int, ...]]],
                 weights: dict[str, LayerWeights] | None, where: str, weights_where: str | None,
                 dynamic_batch: bool = False):
        self.where, self.weights_where = where, weights_where
        self.dynamic_batch = dynamic_batch
        self.weights = weights
        self.nodes: list[Node] = []
        self.consts: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.current: dict[str, str] = {}  # caffe blob name -> IR value of its latest version
        self.taken: set[str] = set()
        self.requested: list[tuple[LayerSpec, list[Blob]]] = []  # blobs each layer asked for
        self.converted: list[LayerSpec] = []
        self.graph: Graph | None = None  # set by the front end once every layer is converted
        self.inputs = [Value(name, "float32", shape) for name, shape in inputs]
        for name, shape in inputs:
            self.current[name] = name
            self.shapes[name] = tuple(shape)
            self.taken.add(name)

    def reserve(self, names: Sequence[str]) -> None:
        """Keep Caffe blob names free for the blobs themselves."""
        self.taken.update(names)

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken, first=2)

    def convert(self, spec: LayerSpec) -> None:
        rule = LAYERS.lookup(spec.type)
        if rule is None:
            hint = _TRAINING_ONLY_HINT if spec.type in _TRAINING_ONLY else \
                f"supported: {', '.join(n for _, n in LAYERS.keys())}"
            raise UnsupportedOpError(f"{self.where}: {spec.label}: Caffe layer type {spec.type!r} is not "
                                     f"supported ({hint})")
        missing = [b for b in spec.bottoms if b not in self.current]
        if missing:
            raise ModelFormatError(f"{self.where}: {spec.label} reads blob(s) {missing} that no earlier "
                                   "layer or input produces")
        context = LayerContext(self, spec)
        self.converted.append(spec)
        first = len(self.nodes)
        rule(context)
        unset = [spec.tops[i] for i in range(len(spec.tops)) if i not in context.top_values]
        if unset:
            raise ConversionError(f"{self.where}: {spec.label}: the converter produced no value for top(s) {unset}")
        self._infer(self.nodes[first:])
        for index, value in context.top_values.items():
            self.current[spec.tops[index]] = value

    def _infer(self, nodes: list[Node]) -> None:
        """Shapes of one layer's new values, from its inputs' (Caffe nets are static)."""
        if not nodes:
            return
        produced = {o for n in nodes for o in n.outputs if o}
        reads = dict.fromkeys(i for n in nodes for i in n.inputs if i and i not in produced)
        inputs = [Value(n, "float32", self.shapes.get(n)) for n in reads if n not in self.consts]
        graph = Graph(nodes, inputs, [Value(o) for o in produced],
                      {n: self.consts[n] for n in reads if n in self.consts}, opset=self._opset(nodes))
        infer_types(graph)
        for name in produced:
            shape = graph.values[name].shape
            if shape is not None and all(isinstance(d, int) for d in shape):
                self.shapes[name] = tuple(shape)

    def finish(self, output_blobs: Sequence[str], name: str) -> Graph:
        """The graph with ``output_blobs`` as outputs; the latest version of each blob is
        renamed to the blob's own name where an earlier version holds it."""
        rename: dict[str, str] = {}
        for blob in dict.fromkeys(output_blobs):
            latest = self.current[blob]
            if latest != blob and blob not in {v.name for v in self.inputs}:
                rename[blob] = self.fresh(f"{blob}/v0")
                rename[latest] = blob
        nodes = [n.with_(inputs=tuple(rename.get(i, i) for i in n.inputs),
                         outputs=tuple(rename.get(o, o) for o in n.outputs)) for n in self.nodes]
        outputs = []
        for blob in dict.fromkeys(output_blobs):
            value = rename.get(self.current[blob], self.current[blob])
            shape = None if self.dynamic_batch else self.shapes.get(self.current[blob])
            outputs.append(Value(value, "float32", shape))
        inputs = self.inputs
        if self.dynamic_batch:  # shapes were tracked for the declared batch; the graph takes any
            inputs = [Value(v.name, v.dtype, ("N", *v.shape[1:])) for v in inputs]
        return Graph(nodes, inputs, outputs, self.consts, opset=self._opset(nodes), name=name)

    @staticmethod
    def _opset(nodes: Sequence[Node]) -> dict[str, int]:
        """ONNX's opset, plus the edgeinfer domain where a rule emitted one of its ops."""
        opset = {"": OPSET}
        if any(n.domain == EDGEINFER_DOMAIN for n in nodes):
            opset[EDGEINFER_DOMAIN] = EDGEINFER_OPSET_VERSION
        return opset


class LayerContext:
    """What a rule sees of the net: its layer, its bottoms' values and shapes, its blobs."""

    def __init__(self, builder: NetBuilder, spec: LayerSpec):
        self.builder, self.spec = builder, spec
        self.name, self.type = spec.name, spec.type
        self.inputs = [builder.current[b] for b in spec.bottoms]
        self.top_values: dict[int, str] = {}
        self._named_main = False

    # -- reading the layer ---------------------------------------------------------------------
    def param(self, field_name: str) -> Any:
        return self.spec.param(field_name)

    def shape(self, index: int = 0) -> tuple[int, ...]:
        return self.value_shape(self.inputs[index])

    def value_shape(self, value: str) -> tuple[int, ...]:
        shape = self.builder.shapes.get(value)
        if shape is None:
            raise ConversionError(f"{self.where}: the shape of {value!r} is unknown; expected static shapes "
                                  "(declare the net's input shapes)")
        return shape

    @property
    def where(self) -> str:
        return f"{self.builder.where}: {self.spec.label}"

    def expect_bottoms(self, *counts: int) -> None:
        if len(self.inputs) not in counts:
            raise ModelFormatError(f"{self.where}: expected {' or '.join(map(str, counts))} bottom(s), "
                                   f"found {len(self.inputs)}")

    def expect_tops(self, *counts: int) -> None:
        if len(self.spec.tops) not in counts:
            raise ModelFormatError(f"{self.where}: expected {' or '.join(map(str, counts))} top(s), "
                                   f"found {len(self.spec.tops)}")

    def unsupported(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.where}: {what}")

    def invalid(self, what: str) -> ModelFormatError:
        return ModelFormatError(f"{self.where}: {what}")

    def blobs(self, expected: Sequence[Blob]) -> list[np.ndarray]:
        """The layer's parameter blobs, checked against the expected shapes (legacy 4-D
        blob shapes are accepted when the element count matches, as Caffe does). Without
        a caffemodel, placeholders filled as each ``Blob`` says."""
        self.builder.requested.append((self.spec, list(expected)))
        if self.builder.weights is None:
            return [self._placeholder(blob, i) for i, blob in enumerate(expected)]
        source = self.builder.weights.get(self.name)
        found = [] if source is None else source.blobs
        if len(found) < len(expected):
            raise ModelFormatError(f"{self.builder.weights_where}: {self.spec.label}: expected "
                                   f"{len(expected)} blob(s), found {len(found)}"
                                   + ("" if source else " (no layer of this name in the caffemodel)"))
        arrays = []
        for index, (blob, array) in enumerate(zip(expected, found, strict=False)):
            if array.shape != blob.shape:
                legacy = source.legacy[index] and array.size == int(np.prod(blob.shape, dtype=np.int64))
                if not legacy:
                    raise ModelFormatError(f"{self.builder.weights_where}: {self.spec.label}: blob {index} "
                                           f"has shape {list(array.shape)}, expected {list(blob.shape)}")
                array = array.reshape(blob.shape)
            arrays.append(array)
        return arrays

    def _placeholder(self, blob: Blob, index: int) -> np.ndarray:
        if not isinstance(blob.fill, str):
            return np.full(blob.shape, blob.fill, dtype=np.float32)
        if math.prod(blob.shape) > MAX_TENSOR_ELEMENTS:
            raise ModelFormatError(f"{self.where}: placeholder blob {index} of shape {list(blob.shape)} would have "
                                   f"more than {MAX_TENSOR_ELEMENTS} elements")
        seed = zlib.crc32(f"{self.name}/{index}".encode())
        fan_in = int(np.prod(blob.shape[1:])) if len(blob.shape) > 1 else 1
        rng = np.random.default_rng(seed)
        return (rng.standard_normal(blob.shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)

    # -- emitting ------------------------------------------------------------------------------
    def const(self, array: np.ndarray | Sequence[Any], suffix: str, dtype: Any = np.float32) -> str:
        name = self.builder.fresh(f"{self.name}/{suffix}")
        self.builder.consts[name] = np.asarray(array, dtype=dtype)
        return name

    def ints(self, values: Sequence[int], suffix: str) -> str:
        return self.const(np.asarray(values, dtype=np.int64), suffix, np.int64)

    def node(self, op_type: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None, *,
             top: int | None = None, tops: Sequence[int] | None = None, suffix: str | None = None,
             domain: str = "") -> str:
        """Emit one op (of ``domain``; ONNX's by default). Its output is top ``top`` of the
        layer, the tops ``tops`` (an op with several outputs), or else a fresh intermediate
        value. Returns the (first) output."""
        indices = list(tops) if tops is not None else [top] if top is not None else []
        if indices:
            outputs = [self._top_value(i) for i in indices]
            node_name = self.name if not self._named_main else \
                self.builder.fresh(f"{self.name}/{suffix or op_type.lower()}")
            self._named_main = True
        else:
            outputs = [self.builder.fresh(f"{self.name}/{suffix or op_type.lower()}")]
            node_name = outputs[0]
        self.builder.nodes.append(Node(op_type, list(inputs), outputs, attrs or {}, name=node_name,
                                       domain=domain))
        return outputs[0]

    def _top_value(self, index: int) -> str:
        if index in self.top_values:
            raise ConversionError(f"{self.where}: top {index} emitted twice")
        blob = self.spec.tops[index]
        value = self.builder.fresh(f"{blob}/{self.name}") if blob in self.builder.current else blob
        self.top_values[index] = value
        return value

    def reshape(self, value: str, target: Sequence[int], *, top: int | None = None, suffix: str = "reshape") -> str:
        """Reshape ``value`` to the static ``target``. Where dim 0 is kept it is written as 0
        (copy), so the graph stays valid for any batch with ``dynamic_batch``."""
        source = self.value_shape(value)
        target = [int(d) for d in target]
        if target and source and target[0] == source[0]:
            target[0] = 0
        elif self.builder.dynamic_batch:
            raise self.unsupported(f"reshape of {list(source)} to {target} folds the batch axis; "
                                   "it cannot be converted with dynamic_batch")
        return self.node("Reshape", [value, self.ints(target, "shape")], top=top, suffix=suffix)

    def batch_axis_untouched(self, axis: int, what: str) -> None:
        """Refuse, under ``dynamic_batch``, an op whose static parameters cover the batch axis."""
        if self.builder.dynamic_batch and axis == 0:
            raise self.unsupported(f"{what} along the batch axis cannot be converted with dynamic_batch")

    def identity(self, value: str, top: int = 0) -> str:
        return self.node("Identity", [value], top=top)
