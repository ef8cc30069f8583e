"""Parse a ``.prototxt`` net definition into layer specs, inputs and net state filtering.

Both layer formats are read: V2 (``layer { type: "Convolution" }``) and legacy V1
(``layers { type: CONVOLUTION }``); V1 types are mapped to their V2 names as Caffe's own
upgrade does, and the parameter messages are the same in both. Layers are filtered by
Caffe's net-state rules (``include``/``exclude`` with phase, level and stages), by default
for the TEST phase of a deploy net.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import text_format

from edgeinfer.converters.caffe.schema import LayerParameter, NetParameter, V1LayerParameter
from edgeinfer.errors import ModelFormatError
from edgeinfer.limits import MAX_TEXT_BYTES

# V1LayerParameter.LayerType -> the V2 type string (Caffe's UpgradeV1LayerType).
V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DATA": "Data", "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence",
    "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice",
    "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}
_V1_ENUM = V1LayerParameter.DESCRIPTOR.enum_types_by_name["LayerType"]
V1_TYPE_NAMES = {value.number: V1_TYPES.get(value.name, value.name) for value in _V1_ENUM.values}
_PHASES = {"TRAIN": 0, "TEST": 1}


class UnknownFieldWarning(UserWarning):
    """A prototxt field outside edgeinfer's Caffe schema was skipped."""


@dataclass
class LayerSpec:
    """One layer of the net, whichever format it was written in."""

    name: str
    type: str
    bottoms: list[str]
    tops: list[str]
    proto: Any  # LayerParameter or V1LayerParameter
    index: int
    phase: str = "TEST"  # the net state's phase (Caffe's layer_param.phase)

    def param(self, field_name: str) -> Any:
        """The layer's ``<field_name>`` message (its defaults if unset or absent in V1)."""
        if field_name in self.proto.DESCRIPTOR.fields_by_name:
            return getattr(self.proto, field_name)
        return getattr(LayerParameter(), field_name)

    def has_param(self, field_name: str) -> bool:
        return field_name in self.proto.DESCRIPTOR.fields_by_name and self.proto.HasField(field_name)

    @property
    def label(self) -> str:
        return f"layer {self.name!r} ({self.type})"


@dataclass
class NetSpec:
    name: str
    inputs: list[tuple[str, tuple[int, ...] | None]]
    layers: list[LayerSpec] = field(default_factory=list)


def parse_prototxt(path: str | os.PathLike) -> Any:
    """Parse the text file into a ``NetParameter`` (fields outside the schema are skipped
    with an ``UnknownFieldWarning``; malformed text raises ``ModelFormatError``)."""
    where = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_TEXT_BYTES:
                raise ModelFormatError(f"{where}: expected a Caffe prototxt of at most {MAX_TEXT_BYTES} bytes, "
                                       f"found {size} bytes")
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFormatError(f"{where}: expected a Caffe prototxt (text NetParameter), cannot read it "
                               f"({exc})") from exc
    try:
        return text_format.Parse(text, NetParameter())
    except RecursionError:
        raise _too_deep(where) from None
    except text_format.ParseError as strict_error:
        if "has no field named" not in str(strict_error):
            raise ModelFormatError(f"{where}: expected a Caffe prototxt (text NetParameter), cannot parse "
                                   f"it: {strict_error}") from strict_error
        first_unknown = strict_error
    try:
        net = text_format.Parse(text, NetParameter(), allow_unknown_field=True)
    except RecursionError:
        raise _too_deep(where) from None
    except text_format.ParseError as exc:
        raise ModelFormatError(f"{where}: expected a Caffe prototxt (text NetParameter), cannot parse "
                               f"it: {exc}") from exc
    warnings.warn(f"{where}: {first_unknown} (and any further unknown fields) skipped: edgeinfer's Caffe "
                  "schema does not know it; a layer that needs it will fail to convert",
                  UnknownFieldWarning, stacklevel=3)
    return net


def _too_deep(where: str) -> ModelFormatError:
    """protobuf's text parser recurses once per nested message (found by fuzzing deep nesting)."""
    return ModelFormatError(f"{where}: expected a Caffe prototxt, found messages nested too deeply to parse")


def _rule_matches(rule: Any, phase: int, level: int, stages: set[str]) -> bool:
    """Caffe's ``StateMeetsRule``."""
    if rule.HasField("phase") and rule.phase != phase:
        return False
    if rule.HasField("min_level") and level < rule.min_level:
        return False
    if rule.HasField("max_level") and level > rule.max_level:
        return False
    if any(stage not in stages for stage in rule.stage):
        return False
    return not any(stage in stages for stage in rule.not_stage)


def _included(layer: Any, phase: int, level: int, stages: set[str]) -> bool:
    if layer.include:
        return any(_rule_matches(rule, phase, level, stages) for rule in layer.include)
    return not any(_rule_matches(rule, phase, level, stages) for rule in layer.exclude)


def _net_inputs(net: Any, where: str) -> list[tuple[str, tuple[int, ...] | None]]:
    names = list(net.input)
    if net.input_shape and net.input_dim:
        raise ModelFormatError(f"{where}: the net declares both input_shape and input_dim; expected one")
    if net.input_shape:
        if len(net.input_shape) != len(names):
            raise ModelFormatError(f"{where}: expected one input_shape per input ({len(names)}), "
                                   f"found {len(net.input_shape)}")
        return [(n, tuple(int(d) for d in s.dim)) for n, s in zip(names, net.input_shape, strict=True)]
    if net.input_dim:
        if len(net.input_dim) != 4 * len(names):
            raise ModelFormatError(f"{where}: expected 4 input_dim values per input ({4 * len(names)}), "
                                   f"found {len(net.input_dim)}")
        dims = [int(d) for d in net.input_dim]
        return [(n, tuple(dims[4 * i:4 * i + 4])) for i, n in enumerate(names)]
    return [(n, None) for n in names]


def read_net(path: str | os.PathLike, *, phase: str = "TEST", level: int = 0,
             stages: tuple[str, ...] = ()) -> NetSpec:
    """Parse a prototxt and keep the layers of the given net state."""
    where = os.fspath(path)
    if phase not in _PHASES:
        raise ValueError(f"phase must be one of {list(_PHASES)}, got {phase!r}")
    net = parse_prototxt(path)
    if net.layer and net.layers:
        raise ModelFormatError(f"{where}: the net mixes V2 'layer' and V1 'layers' entries; expected one format")
    spec = NetSpec(net.name or os.path.splitext(os.path.basename(where))[0], _net_inputs(net, where))
    phase_number, stage_set = _PHASES[phase], set(stages)
    for index, layer in enumerate(net.layer or net.layers):
        if not _included(layer, phase_number, level, stage_set):
            continue
        if net.layers:
            type_name = V1_TYPES.get(V1LayerParameter.LayerType.Name(layer.type), "")
        else:
            type_name = layer.type
        if not type_name:
            raise ModelFormatError(f"{where}: layer {layer.name or index!r} has no type")
        spec.layers.append(LayerSpec(layer.name or f"{type_name.lower()}_{index}", type_name,
                                     list(layer.bottom), list(layer.top), layer, index, phase))
    names = [layer.name for layer in spec.layers]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ModelFormatError(f"{where}: layer name {duplicate!r} is used twice; expected unique layer names")
    return spec
