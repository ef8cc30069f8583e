"""A compiled ``.eim`` read for its plan alone: the header, the document and the compiled section
are checked as ``load_model`` checks them, but no graph is built (a device that runs every part
from its artifact never needs the IR's nodes; ``runtime.lean.build_lean``).

``read_compiled`` returns None for a file that is no ``.eim``, one with no compiled section, or one
made from another IR (said once, as ``load_model`` says it); the model's inputs and outputs, its metadata and the
initializers a part's artifact reads come from the document, the graph itself from
``load_model`` when something asks for it.

The file is read, not mapped: the header and the document, then each artifact's bytes into one
``bytes`` object (what an engine that takes a model buffer keeps: a map would add the pages it
touched, and the artifact's checksum touches them all). The tensor table is checked here and its
tensors are mapped only when an artifact reads initializers (``CompiledFile.weights``). Only the
reading half of the format is imported (``format.reading``), not the writer's (``format.eim``).
"""

from __future__ import annotations

import os
import stat
from typing import Any

import numpy as np

from edgeinfer.errors import ModelFormatError
from edgeinfer.format.compiled import CompiledSection, bound_to_ir, read_ahead, read_section
from edgeinfer.format.document import _GRAPH_FIELDS, DocumentReader
from edgeinfer.format.reading import (
    COMPILED_VERSION,
    HEADER_SIZE,
    MAGIC,
    Header,
    checked_document,
    parse_document,
    read_header,
    read_tensors,
    source_path,
    stale,
    stored_document,
    tensors_end,
)
from edgeinfer.ir import Value
from edgeinfer.ir.weights import widen_stored


class CompiledFile:
    """What a compiled ``.eim`` says without its graph."""

    def __init__(self, source: str, section: CompiledSection, name: str, inputs: list[Value], outputs: list[Value],
                 metadata: dict[str, str], reader: DocumentReader, table: list[Any], header: Header,
                 initializers: dict[str, int], graph_metadata: dict[str, str]) -> None:
        self.source = source
        self.section = section
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.metadata = metadata
        self._reader = reader
        self._table = table  # the tensor table as stored (checked); mapped by the first ``weights``
        self._header = header
        self._initializers = initializers  # name -> tensor index
        self._graph_metadata = graph_metadata

    def weights(self, names: list[str]) -> dict[str, np.ndarray]:
        """The initializers ``names`` as the loaded graph holds them (stored narrow: widened)."""
        wanted = [name for name in names if name in self._initializers]
        if not wanted:
            return {}
        if not self._reader.tensors:
            self._reader.tensors = self._map_tensors()
        found = {name: self._reader.tensors[self._initializers[name]] for name in wanted}
        return widen_stored(found, self._graph_metadata)

    def _map_tensors(self) -> list[np.ndarray]:
        from edgeinfer.format.eim import close_map, map_file

        mapped = map_file(self.source)
        try:
            header = read_header(mapped, self.source)
            if header != self._header:
                raise ModelFormatError(f"{self.source}: the file changed since it was opened: expected the "
                                       "compiled model it held")
            return read_tensors(mapped, header, self._table, self._reader)
        finally:
            close_map(mapped)  # closes once no tensor view is left


def read_compiled(path: str | os.PathLike) -> CompiledFile | None:
    """The compiled file at ``path`` without its graph; None where ``path`` is no ``.eim`` file that
    can be opened (its loader then says why), holds no compiled section or one of another IR."""
    try:
        source = source_path(path)
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except (ModelFormatError, OSError, ValueError):
        return None
    try:
        return _read(fd, source)
    except RecursionError:
        raise ModelFormatError(f"{source}: the document nests too deeply to read") from None
    finally:
        os.close(fd)


def _read(fd: int, source: str) -> CompiledFile | None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return None
    head = _pread(fd, min(HEADER_SIZE, info.st_size), 0)
    if head[:len(MAGIC)] != MAGIC:
        return None
    header = read_header(head, source, info.st_size)
    if (header.major, header.minor) < COMPILED_VERSION:
        return None
    text = stored_document(_pread(fd, header.json_length, HEADER_SIZE), header, source)
    document = parse_document(text, header, source)
    keys = list(document)
    reader, document, compiled = checked_document(document, header, source)
    if compiled is None:
        return None
    metadata = reader.str_map(document["metadata"], "document.metadata")
    table = reader.array(document["tensors"], "document.tensors")
    graph = reader.fields(document["graph"], "document.graph", _GRAPH_FIELDS)
    initializers = {}
    for i, item in enumerate(reader.array(graph["initializers"], "document.graph.initializers")):
        at = f"document.graph.initializers[{i}]"
        item = reader.fields(item, at, ("name", "tensor"))
        initializers[reader.name(item["name"], f"{at}.name")] = reader.integer(
            item["tensor"], f"{at}.tensor", maximum=max(len(table) - 1, 0))
    nodes = len(reader.array(graph["nodes"], "document.graph.nodes"))
    section = read_section(compiled, reader, lambda start, nbytes: _read_at(source, start, nbytes),
                           header.data_offset, header.data_length, _checked_end(table, header, reader), nodes)
    if not bound_to_ir(section, text, keys, document, compiled):
        stale(section, source)
        return None
    read_ahead(section.artifacts)  # checked when a part is built from one
    return CompiledFile(source, section, reader.name(graph["name"], "document.graph.name"),
                        reader.values(graph["inputs"], "document.graph.inputs"),
                        reader.values(graph["outputs"], "document.graph.outputs"), metadata, reader, table, header,
                        initializers, reader.str_map(graph["metadata"], "document.graph.metadata"))


def _checked_end(table: list[Any], header: Header, reader: DocumentReader) -> int:
    """Where the tensors end in the data section, every entry of the table checked (``read_tensors``
    without the views: the bytes are mapped if an artifact reads initializers)."""
    read_tensors(None, header, table, reader, views=False)
    return tensors_end(table)


def _read_at(source: str, start: int, nbytes: int) -> bytes:
    """``nbytes`` of the file at ``start``, opened again (an artifact read ahead on another thread,
    after the document's reader closed the file; a file replaced meanwhile fails its checksum)."""
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ModelFormatError(f"{source}: expected a regular .eim file, found a special file")
        return _pread(fd, nbytes, start)
    finally:
        os.close(fd)


def _pread(fd: int, nbytes: int, offset: int) -> bytes:
    data = os.pread(fd, nbytes, offset)
    while len(data) < nbytes:  # a short read (a signal, a network file system): read the rest
        more = os.pread(fd, nbytes - len(data), offset + len(data))
        if not more:
            raise ModelFormatError(f"expected {nbytes} bytes at offset {offset}, found {len(data)} (the file "
                                   "was truncated while it was read)")
        data += more
    return data
