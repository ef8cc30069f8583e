"""Reduced precision on OpenVINO: what this CPU plugin offers, and nodes kept in f32.

- ``reduced_precisions(native)``: bf16 / f16 (``INFERENCE_PRECISION_HINT``) where the CPU
  computes them natively (``native``: ``edgeinfer.runtime.precision.native_precisions``) and the
  CPU plugin lists them among its ``OPTIMIZATION_CAPABILITIES``.
- ``keep_fp32(model, outputs)``: the engine option ``fp32_nodes`` (mixed precision). OpenVINO
  keeps a node in its original precision when the node carries the ``precise`` runtime
  attribute (``ov::disable_fp16_compression``, honoured for bf16 and f16 alike), which its
  Python API cannot create; an IR ``<rt_info><attribute name="precise" version="0"/>`` on the
  layer can, so the model goes through OpenVINO's own IR (``save_model`` / ``read_model``, in a
  private temporary folder) with the attribute added to the nodes writing ``outputs``. The
  CPU plugin's snippets tokenizer fuses eltwise and MLP chains into subgraphs that ignore the
  attribute (measured: a marked MatMul inside one stayed bf16), so a model with f32 nodes is
  compiled with ``SNIPPETS_MODE=DISABLE`` (``compile_config``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_HINTS = {"bf16": ("BF16", "bf16"), "fp16": ("FP16", "f16")}  # precision -> (capability, hint)


def reduced_precisions(native: Mapping[str, str | None]) -> dict[str, Any]:
    """Per precision: the engine options of the configuration, or why it is not offered."""
    from .backend import core

    try:
        capabilities = set(core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    except Exception as exc:  # noqa: BLE001 - a plugin that does not answer offers nothing
        return {p: f"OpenVINO's CPU plugin did not list its capabilities ({exc})" for p in _HINTS}
    offered: dict[str, Any] = {}
    for precision, (capability, hint) in _HINTS.items():
        if capability in capabilities:
            offered[precision] = {"precision": hint}
        else:
            offered[precision] = f"OpenVINO's CPU plugin lists no {capability} among its OPTIMIZATION_CAPABILITIES"
    return offered


_SOURCES = ("Parameter", "Constant", "Result")


def _translations(model: Any, outputs: set[str]) -> list[str]:
    """Friendly names of the ops that write ``outputs`` and of the unnamed ops before them (one
    ONNX node can become several ops: Gemm is a MatMul and an Add, and the plugin fuses the
    MatMul's precision into both)."""
    marked: dict[str, None] = {}
    stack = [op for op in model.get_ordered_ops() if op.get_type_name() not in _SOURCES
             and any(outputs & set(port.get_names()) for port in op.outputs())]
    while stack:
        op = stack.pop()
        if op.get_friendly_name() in marked:
            continue
        marked[op.get_friendly_name()] = None
        for port in op.inputs():
            source = port.get_source_output()
            parent = source.get_node()
            if parent.get_type_name() not in _SOURCES and not source.get_names():
                stack.append(parent)
    return list(marked)


def keep_fp32(model: Any, outputs: Iterable[str]) -> tuple[Any, list[str]]:
    """``model`` with the nodes writing any of ``outputs`` (tensor names) kept in f32, and the
    friendly names of those nodes."""
    import os
    import tempfile
    import xml.etree.ElementTree as ElementTree

    import numpy as np
    import openvino as ov

    from .backend import core

    marked = _translations(model, set(outputs))
    if not marked:
        return model, []
    names = set(marked)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-ov-") as folder:
        xml_path, bin_path = os.path.join(folder, "model.xml"), os.path.join(folder, "model.bin")
        ov.save_model(model, xml_path, compress_to_fp16=False)
        tree = ElementTree.parse(xml_path)
        for layer in tree.getroot().iter("layer"):
            if layer.get("name") in names:
                info = layer.find("rt_info")
                if info is None:
                    info = ElementTree.Element("rt_info")
                    layer.insert(0, info)
                ElementTree.SubElement(info, "attribute", {"name": "precise", "version": "0"})
        text = ElementTree.tostring(tree.getroot(), encoding="unicode")
        weights = ov.Tensor(np.fromfile(bin_path, dtype=np.uint8))  # copied: nothing maps the folder
    return core().read_model(text, weights), marked
