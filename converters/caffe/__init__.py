"""Caffe front end: ``deploy.prototxt`` (+ ``.caffemodel`` weights) into the IR, in pure Python.

No Caffe build is needed: the prototxt is parsed with ``protobuf``'s text format against a
schema written in this package (``schema.py``) and the weights are read straight from the
binary wire format (``caffemodel.py``). Each Caffe layer type has one rule (``layers/``) that
emits standard ONNX ops; fusion (BatchNorm + Scale into Conv, ...) is left to passes.

    ei.convert("deploy.prototxt", weights="net.caffemodel")

Options of ``convert``: ``weights`` (caffemodel path; without it the net gets random
placeholder weights and a ``RandomWeightsWarning``, for structure checks), ``input_shapes``
(``{"data": (1, 3, 224, 224)}``, for inputs the prototxt leaves unsized or to override),
``outputs`` (blob names to expose instead of the net's unconsumed blobs), ``phase``,
``level`` and ``stages`` (the net state for ``include``/``exclude`` rules; TEST by default).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.converters.caffe import layers as _layers  # noqa: F401  (registers the rules)
from edgeinfer.converters.caffe.builder import LAYERS, NetBuilder, RandomWeightsWarning
from edgeinfer.converters.caffe.caffemodel import read_caffemodel, write_caffemodel
from edgeinfer.converters.caffe.prototxt import V1_TYPES, LayerSpec, NetSpec, UnknownFieldWarning, read_net
from edgeinfer.errors import ModelFormatError
from edgeinfer.ir import Graph
from edgeinfer.limits import MAX_RANK, MAX_TENSOR_ELEMENTS

SUFFIXES = (".prototxt",)

__all__ = ["accepts", "convert", "supported_layers", "random_caffemodel", "read_caffemodel", "write_caffemodel",
           "RandomWeightsWarning", "UnknownFieldWarning"]


def accepts(source: Any) -> bool:
    return isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() in SUFFIXES


def supported_layers() -> list[str]:
    """Caffe layer types this front end converts (``Input`` is handled by the net itself)."""
    return sorted({"Input", *(name for _, name in LAYERS.keys())})


def random_caffemodel(source: str | os.PathLike, path: str | os.PathLike, *, seed: int = 0,
                      v1: bool = False, **options: Any) -> None:
    """Write a caffemodel of random weights for the net ``source`` (for structure checks,
    benchmarks and tests). Statistics, scales and slopes are drawn positive (a variance must
    be), weights from a fan-in scaled normal distribution."""
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        builder = _build(source, None, **options)
    v1_names = {v2: v1_name for v1_name, v2 in V1_TYPES.items()}
    requested = {spec.name: expected for spec, expected in builder.requested}
    layers = []
    for spec in builder.converted:  # every layer, as Caffe writes them, with or without blobs
        blobs = []
        for blob in requested.get(spec.name, []):
            if isinstance(blob.fill, str):
                fan_in = int(np.prod(blob.shape[1:])) if len(blob.shape) > 1 else 1
                blobs.append(rng.standard_normal(blob.shape) / np.sqrt(max(fan_in, 1)))
            else:
                blobs.append(rng.uniform(0.5, 1.5, blob.shape))
        layers.append((spec.name, v1_names[spec.type] if v1 else spec.type, blobs))
    write_caffemodel(path, layers, v1=v1, legacy_shapes=v1)


def convert(source: str | os.PathLike, *, weights: str | os.PathLike | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            outputs: Sequence[str] | None = None, phase: str = "TEST", level: int = 0,
            stages: Sequence[str] = (), dynamic_batch: bool = False) -> Graph:
    """Convert a Caffe net definition (and its weights) into a ``Graph``.

    With ``dynamic_batch`` the inputs' first dim becomes the symbol ``N``: shapes are worked
    out for the declared batch and every reshape keeps dim 0 as a copy of its input's, so the
    graph runs at any batch size (a layer that folds or slices the batch axis is refused).
    """
    builder = _build(source, weights, input_shapes=input_shapes, outputs=outputs, phase=phase, level=level,
                     stages=stages, dynamic_batch=dynamic_batch)
    return builder.graph


def _build(source: str | os.PathLike, weights: str | os.PathLike | None, *,
           input_shapes: Mapping[str, Sequence[int]] | None = None, outputs: Sequence[str] | None = None,
           phase: str = "TEST", level: int = 0, stages: Sequence[str] = (), dynamic_batch: bool = False) -> NetBuilder:
    where = os.fspath(source)
    if not Path(source).is_file():
        raise ModelFormatError(f"{where}: expected a Caffe prototxt file, found no such file")
    net = read_net(source, phase=phase, level=level, stages=tuple(stages))
    inputs = _inputs(net, dict(input_shapes or {}), where)
    if weights is None:
        warnings.warn(f"{where}: no weights given (weights=...caffemodel); the net gets random "
                      "placeholder weights, good for structure checks only", RandomWeightsWarning, stacklevel=2)
        blobs = None
    else:
        blobs = read_caffemodel(weights)
    builder = NetBuilder(inputs, blobs, where, None if weights is None else os.fspath(weights),
                         dynamic_batch=dynamic_batch)
    builder.reserve([top for layer in net.layers for top in layer.tops] + [layer.name for layer in net.layers])
    for layer in net.layers:
        if layer.type != "Input":
            builder.convert(layer)
    wanted = list(outputs) if outputs else _unconsumed_blobs(net)
    unknown = [name for name in wanted if name not in builder.current]
    if unknown:
        raise ModelFormatError(f"{where}: requested output blob(s) {unknown} are not produced by the net")
    if not wanted:
        raise ModelFormatError(f"{where}: the net has no output blobs (every blob is consumed)")
    graph = builder.finish(wanted, net.name)
    graph.metadata["caffe_layer_format"] = "V1" if net.layers and net.layers[0].proto.DESCRIPTOR.name == \
        "V1LayerParameter" else "V2"
    builder.graph = graph
    return builder


def _inputs(net: NetSpec, overrides: dict[str, Sequence[int]], where: str) -> list[tuple[str, tuple[int, ...]]]:
    declared: list[tuple[str, tuple[int, ...] | None]] = list(net.inputs)
    for layer in net.layers:
        if layer.type == "Input":
            declared.extend(_input_layer_shapes(layer, where))
    unknown = [name for name in overrides if name not in {n for n, _ in declared}]
    if unknown:
        raise ModelFormatError(f"{where}: input_shapes names {unknown}, but the net's inputs are "
                               f"{[n for n, _ in declared]}")
    resolved = []
    for name, shape in declared:
        shape = overrides.get(name, shape)
        if shape is None or not shape:
            raise ModelFormatError(f"{where}: input {name!r} has no shape; expected input_shape/input_dim "
                                   "in the prototxt or input_shapes={...} in convert()")
        if any(int(d) <= 0 for d in shape):
            raise ModelFormatError(f"{where}: input {name!r} has shape {list(shape)}; expected positive dims")
        if len(shape) > MAX_RANK or math.prod(int(d) for d in shape) > MAX_TENSOR_ELEMENTS:
            raise ModelFormatError(f"{where}: input {name!r} has shape {list(shape)}; expected at most {MAX_RANK} "
                                   f"dims and {MAX_TENSOR_ELEMENTS} elements")
        resolved.append((name, tuple(int(d) for d in shape)))
    if not resolved:
        raise ModelFormatError(f"{where}: the net declares no inputs (input:/input_shape or an Input layer)")
    return resolved


def _input_layer_shapes(layer: LayerSpec, where: str) -> list[tuple[str, tuple[int, ...] | None]]:
    shapes = [tuple(int(d) for d in s.dim) for s in layer.param("input_param").shape]
    if len(shapes) not in (0, 1, len(layer.tops)):
        raise ModelFormatError(f"{where}: {layer.label}: expected 1 or {len(layer.tops)} shapes, found {len(shapes)}")
    if not shapes:
        return [(top, None) for top in layer.tops]
    return [(top, shapes[0] if len(shapes) == 1 else shapes[i]) for i, top in enumerate(layer.tops)]


def _unconsumed_blobs(net: NetSpec) -> list[str]:
    """Caffe's net outputs: blobs some layer produces and no later layer reads."""
    available: dict[str, None] = {}
    for layer in net.layers:
        for bottom in layer.bottoms:
            available.pop(bottom, None)
        for top in layer.tops:
            if layer.type != "Input":
                available[top] = None
    return list(available)
