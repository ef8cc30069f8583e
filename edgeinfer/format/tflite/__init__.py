"""TFLite flatbuffers written without TensorFlow: ``export_tflite(graph)`` -> bytes and
``save_tflite(graph, path)`` (atomic). ``schema`` holds the field numbers the writer and the
importer's reader share; ``export`` documents the layout and quantization scheme."""

from __future__ import annotations

import os

from edgeinfer.format.tflite.export import RULES, export_graph, node_support
from edgeinfer.ir import Graph


def export_tflite(graph: Graph, *, description: str = "edgeinfer") -> bytes:
    """The ``.tflite`` flatbuffer of ``graph``; ``UnsupportedOpError`` names a node it cannot express."""
    return export_graph(graph, description=description)


def save_tflite(graph: Graph, path: str | os.PathLike, *, description: str = "edgeinfer") -> int:
    """Write ``graph`` as a ``.tflite`` file (atomically); returns the size in bytes."""
    from edgeinfer.format.atomic import atomic_write_bytes

    data = export_tflite(graph, description=description)
    atomic_write_bytes(path, data)
    return len(data)


__all__ = ["RULES", "export_tflite", "node_support", "save_tflite"]
