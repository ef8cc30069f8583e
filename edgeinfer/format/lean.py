"""A compiled ``.eim`` read for its plan alone: the header, the document, the tensor table and the
compiled section are checked as ``load_model`` checks them, but no graph is built (a device that
runs every part from its artifact never needs the IR's nodes; ``runtime.aot.build_lean``).

``read_compiled`` returns None for a file with no compiled section, or one made from another IR
(said once, as ``load_model`` says it); the model's inputs and outputs, its metadata and the
initializers a part's artifact reads come from the document, the graph itself from
``load_model`` when something asks for it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from edgeinfer.errors import ModelFormatError
from edgeinfer.format.compiled import CompiledSection, ir_digest, read_section
from edgeinfer.format.document import _GRAPH_FIELDS, DocumentReader
from edgeinfer.format.eim import (
    COMPILED_VERSION,
    _read_tensors,
    checked_document,
    close_map,
    map_file,
    read_document,
    read_header,
    source_path,
    stale,
    tensors_end,
)
from edgeinfer.ir import Value
from edgeinfer.ir.weights import widen_stored


class CompiledFile:
    """What a compiled ``.eim`` says without its graph."""

    def __init__(self, source: str, section: CompiledSection, name: str, inputs: list[Value], outputs: list[Value],
                 metadata: dict[str, str], reader: DocumentReader, initializers: dict[str, int],
                 graph_metadata: dict[str, str]) -> None:
        self.source = source
        self.section = section
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.metadata = metadata
        self._reader = reader
        self._initializers = initializers  # name -> tensor index
        self._graph_metadata = graph_metadata

    def weights(self, names: list[str]) -> dict[str, np.ndarray]:
        """The initializers ``names`` as the loaded graph holds them (stored narrow: widened)."""
        found = {name: self._reader.tensors[self._initializers[name]] for name in names if name in self._initializers}
        return widen_stored(found, self._graph_metadata)


def read_compiled(path: str | os.PathLike) -> CompiledFile | None:
    source = source_path(path)
    mapped = map_file(source)
    try:
        return _read(mapped, source)
    except RecursionError:
        raise ModelFormatError(f"{source}: the document nests too deeply to read") from None
    finally:
        close_map(mapped)  # closes once no tensor view is left


def _read(mapped: Any, source: str) -> CompiledFile | None:
    header = read_header(mapped, source)
    if (header.major, header.minor) < COMPILED_VERSION:
        return None
    reader, document, compiled = checked_document(read_document(mapped, header, source), header, source)
    if compiled is None:
        return None
    metadata = reader.str_map(document["metadata"], "document.metadata")
    reader.tensors = _read_tensors(mapped, header, document["tensors"], reader)
    graph = reader.fields(document["graph"], "document.graph", _GRAPH_FIELDS)
    initializers = {}
    for i, item in enumerate(reader.array(graph["initializers"], "document.graph.initializers")):
        at = f"document.graph.initializers[{i}]"
        item = reader.fields(item, at, ("name", "tensor"))
        initializers[reader.name(item["name"], f"{at}.name")] = reader.integer(
            item["tensor"], f"{at}.tensor", maximum=max(len(reader.tensors) - 1, 0))
    nodes = len(reader.array(graph["nodes"], "document.graph.nodes"))
    section = read_section(compiled, reader, mapped, header.data_offset, header.data_length,
                           tensors_end(document["tensors"]), nodes)
    if section.digest != ir_digest(document):
        stale(section, source)
        return None
    return CompiledFile(source, section, reader.name(graph["name"], "document.graph.name"),
                        reader.values(graph["inputs"], "document.graph.inputs"),
                        reader.values(graph["outputs"], "document.graph.outputs"), metadata, reader, initializers,
                        reader.str_map(graph["metadata"], "document.graph.metadata"))

