"""A compiled ``.eim`` read for its plan alone: the header, the document and the compiled section
are checked as ``load_model`` checks them, but no graph is built (a device that runs every part
from its artifact never needs the IR's nodes; ``runtime.lean.build_lean``).

``read_compiled`` returns None for a file that is no ``.eim``, one with no compiled section, or one
made from another IR (said once, as ``load_model`` says it); the model's inputs and outputs, its metadata and the
initializers a part's artifact reads come from the document, the graph itself from
``load_model`` when something asks for it.

A version 3.5 file as ``save_model`` writes it is read without parsing its IR (``_read_lean``): the
document's head (format, version, metadata) and its compiled section, at the end, are parsed as
strictly as ever; the bytes between (tensor table and graph) are hashed against the section's
``ir_sha256`` and not parsed, the graph's name, inputs and outputs coming from the section's copy
(``io``). Its tensor table is parsed (and checked) only when an artifact reads initializers
(``CompiledFile.weights``): ``palm_detection_lite``'s 48 KB document, 2.5 ms, now 0.5 ms.

The file is read, not mapped: the header and the document, then each artifact's bytes into one
``bytes`` object (what an engine that takes a model buffer keeps: a map would add the pages it
touched, and the artifact's checksum touches them all). The tensor table is checked here and its
tensors are mapped only when an artifact reads initializers (``CompiledFile.weights``). Only the
reading half of the format is imported (``format.reading``), not the writer's (``format.eim``).
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import numpy as np

from edgeinfer.errors import ModelFormatError
from edgeinfer.format.compiled import (
    CompiledSection,
    bound_to_ir,
    check_io,
    io_nodes,
    read_section,
)
from edgeinfer.format.document import _GRAPH_FIELDS, DocumentReader, sha256
from edgeinfer.format.reading import (
    COMPILED_VERSION,
    FORMAT_NAME,
    HEADER_SIZE,
    LEAN_VERSION,
    MAGIC,
    READABLE_MINOR,
    Header,
    _refuse_constant,
    _unique_keys,
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
        if not names:
            return {}
        if self._initializers is None:  # read lean, which no file whose artifacts read initializers is
            raise ModelFormatError(f"{self.source}: read without its IR, asked for initializers {names[:3]}")
        wanted = [name for name in names if name in self._initializers]
        if not wanted:
            return {}
        if not self._reader.tensors:
            self._reader.tensors = self._map_tensors()
        from edgeinfer.ir.weights import widen_stored

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
    if (header.major, header.minor) >= LEAN_VERSION:
        found = _read_lean(text, header, source)
        if found is not None:
            return None if found is _STALE else found
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
    name = reader.name(graph["name"], "document.graph.name")
    inputs = reader.values(graph["inputs"], "document.graph.inputs")
    outputs = reader.values(graph["outputs"], "document.graph.outputs")
    check_io(section, name, inputs, outputs, source)
    return CompiledFile(source, section, name, inputs, outputs, metadata, reader, table, header, initializers,
                        reader.str_map(graph["metadata"], "document.graph.metadata"))


_STALE = object()  # ``_read_lean``: the section was made from another IR
_HEAD = '{"format":' + json.dumps(FORMAT_NAME) + ',"version":'
_METADATA, _TENSORS, _COMPILED = ',"metadata":', ',"tensors":', ',"compiled":'


def _read_lean(text: bytes, header: Header, source: str) -> CompiledFile | object | None:
    """A version 3.5 document as ``save_model`` writes it, its IR hashed and not parsed (see the
    module docstring); None where it is stored otherwise (the whole document is parsed then).
    ``_STALE``: a section of another IR (said once)."""
    if not text.isascii() or not text.startswith(_HEAD.encode()):  # the writer escapes to ASCII
        return None
    string = text.decode("ascii")
    decoder = json.JSONDecoder(parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    try:
        version, at = decoder.raw_decode(string, len(_HEAD))
        if version != [header.major, header.minor] or not string.startswith(_METADATA, at):
            return None
        core_start = at + 1  # the bytes ``ir_sha256`` covers: from "metadata" to the compiled section
        metadata, at = decoder.raw_decode(string, at + len(_METADATA))
        if not string.startswith(_TENSORS, at):
            return None
        compiled, end = None, len(string)
        while compiled is None:  # the last "compiled" key whose object ends the document
            end = string.rfind(_COMPILED, at, end)
            if end < 0:
                return None
            try:
                found, stop = decoder.raw_decode(string, end + len(_COMPILED))
            except ValueError:
                continue
            if stop == len(string) - 1 and string[stop] == "}":
                compiled = found
    except ValueError as exc:  # JSONDecodeError, an int too long to convert
        raise ModelFormatError(f"{source}: JSON document: {exc}") from None
    reader = DocumentReader([], source, strict=header.minor <= READABLE_MINOR[header.major])
    nodes = io_nodes(compiled, reader)
    if nodes is None:
        return None
    metadata = reader.str_map(metadata, "document.metadata")
    section = read_section(compiled, reader, lambda start, nbytes: _read_at(source, start, nbytes),
                           header.data_offset, header.data_length, 0, nodes)
    if any(stored.facts.get("reads") for stored in section.artifacts):
        return None  # an artifact reads initializers (onnxruntime's, the weights left in the file): parsed whole
    digest = sha256(b"{", end - core_start)
    digest.update(memoryview(text)[core_start:end])
    digest.update(b"}")
    if digest.hexdigest() != section.ir_sha256:
        stale(section, source)
        return _STALE
    io = section.io
    _check_io_parts(io, section.parts, reader)
    return CompiledFile(source, section, io["name"], io["inputs"], io["outputs"], metadata, reader, None, header,
                        None, None)


def _check_io_parts(io: dict[str, Any], parts: list[dict[str, Any]], reader: DocumentReader) -> None:
    """The section's copy of the graph's inputs and outputs must be what its parts read and write
    (its IR, which a full load checks the copy against, is not parsed here): every part reads the
    graph's inputs or what an earlier part wrote, and every graph output is written by a part."""
    known = {value.name for value in io["inputs"]}
    for number, part in enumerate(parts):
        for value in part["inputs"]:
            if value.name not in known:
                raise reader.fail(f"document.compiled.parts[{number}].inputs", "graph inputs (compiled.io) or "
                                  "outputs of an earlier part", value.name)
        known.update(value.name for value in part["outputs"])
    missing = [value.name for value in io["outputs"] if value.name not in known]
    if missing:
        raise reader.fail("document.compiled.io.outputs", "outputs the parts write", missing)


def _checked_end(table: list[Any], header: Header, reader: DocumentReader) -> int:
    """Where the tensors end in the data section, every entry of the table checked (``read_tensors``
    without the views: the bytes are mapped if an artifact reads initializers)."""
    read_tensors(None, header, table, reader, views=False)
    return tensors_end(table)


def _read_at(source: str, start: int, nbytes: int) -> bytes:
    """``nbytes`` of the file at ``start``, opened again (an artifact read when its part is built,
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
