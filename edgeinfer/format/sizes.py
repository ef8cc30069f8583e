"""Where the bytes of an ``.eim`` file go: tensors by dtype, the document, the header, padding.

    breakdown = size_breakdown("model.eim")
    print("\\n".join(breakdown.lines()))      # what ``edgeinfer inspect`` prints

Read from the file's own header and tensor table (checked as ``load_model`` checks them), so
the figures are those of the file on disk, not of the graph in memory.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.format.document import TAG, DocumentReader
from edgeinfer.format.eim import HEADER_SIZE, close_map, document_bytes, map_file, parse_document, read_header


@dataclass(frozen=True)
class SizeBreakdown:
    """Byte counts of one ``.eim`` file: ``tensors + header + document + padding == total``."""

    total: int
    version: tuple[int, int]
    header: int
    document: int  # as stored (compressed from version 2 on)
    document_json: int  # the JSON text it holds
    padding: int  # zero bytes: after the document up to the data section, and between tensors
    tensor_bytes: dict[str, int]  # dtype as stored (an int32 bias stored as int16 counts as int16) -> bytes
    tensor_counts: dict[str, int]  # dtype -> number of stored tensors (str: elements in the document)
    references: int  # tensor references in the graph: initializers and tensor attributes
    derived: int = 0  # product entries (version 3): tensors computed on load, no bytes stored
    # top-graph initializer name -> the bytes its tensor takes in the file (0 for a product, and
    # for a name whose tensor an earlier name already holds: each stored tensor is counted once)
    initializer_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def tensors(self) -> int:
        return sum(self.tensor_bytes.values())

    @property
    def overhead(self) -> int:
        """Everything but tensor bytes: the header, the document and padding."""
        return self.total - self.tensors

    def lines(self) -> list[str]:
        stored = sum(self.tensor_counts.values())
        by_dtype = ", ".join(f"{dtype} {self.tensor_bytes.get(dtype, 0):,} (x{count})"
                             for dtype, count in sorted(self.tensor_counts.items(),
                                                        key=lambda item: -self.tensor_bytes.get(item[0], 0)))
        shared = f"; {self.references} references to {stored} stored tensors" if self.references > stored else ""
        shared += f"; {self.derived} computed on load (products)" if self.derived else ""
        json_size = f" ({self.document_json:,} as JSON)" if self.document_json != self.document else ""
        share = 100 * self.tensors / self.total if self.total else 0.0
        return [
            f"file    {self.total:,} bytes (.eim {self.version[0]}.{self.version[1]}): tensors {self.tensors:,} "
            f"({share:.1f}%), format overhead {self.overhead:,}",
            f"tensors {by_dtype or 'none'}{shared}",
            f"format  header {self.header}, document {self.document:,}{json_size}, padding {self.padding:,}",
        ]


def size_breakdown(path: str | os.PathLike) -> SizeBreakdown:
    """The byte breakdown of the ``.eim`` file at ``path`` (``ModelFormatError`` if it is not one)."""
    source = os.fsdecode(os.fspath(path))
    mapped = map_file(source)
    try:
        total = len(mapped)
        header = read_header(mapped, source)
        raw = document_bytes(mapped, header, source)
    finally:
        close_map(mapped)
    document = parse_document(raw, header, source)
    reader = DocumentReader([], source, strict=False)
    document = reader.fields(document, "document", ("tensors", "graph"))
    tensor_bytes: Counter[str] = Counter()
    tensor_counts: Counter[str] = Counter()
    derived = 0
    stored_bytes: dict[int, int] = {}
    for index, entry in enumerate(reader.array(document["tensors"], "document.tensors")):
        entry = reader.fields(entry, f"document.tensors[{index}]", ("dtype", "shape"))
        dtype = reader.string(entry.get("stored", entry["dtype"]), f"document.tensors[{index}].dtype")
        if "product" in entry:
            derived += 1
            continue
        tensor_counts[dtype] += 1
        if "nbytes" in entry:
            stored_bytes[index] = reader.integer(entry["nbytes"], f"document.tensors[{index}].nbytes",
                                                 maximum=header.data_length)
            tensor_bytes[dtype] += stored_bytes[index]
    stored = sum(tensor_bytes.values())
    return SizeBreakdown(
        total=total, version=(header.major, header.minor), header=HEADER_SIZE, document=header.json_length,
        document_json=len(raw), padding=header.data_offset - HEADER_SIZE - header.json_length
        + header.data_length - stored, tensor_bytes=dict(tensor_bytes), tensor_counts=dict(tensor_counts),
        references=_references(document["graph"]), derived=derived,
        initializer_bytes=_initializer_bytes(document["graph"], stored_bytes))


def _initializer_bytes(graph: Any, stored_bytes: dict[int, int]) -> dict[str, int]:
    """Stored bytes per top-graph initializer name, each tensor counted at its first name."""
    out: dict[str, int] = {}
    counted: set[int] = set()
    for item in (graph.get("initializers") or ()) if isinstance(graph, dict) else ():
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("tensor"), int):
            index = item["tensor"]
            out[item["name"]] = 0 if index in counted else stored_bytes.get(index, 0)
            counted.add(index)
    return out


def _references(graph: Any) -> int:
    """Initializer entries and tensor attributes of a graph document, subgraphs included."""
    if not isinstance(graph, dict):
        return 0
    count = len(graph.get("initializers") or ())
    for node in graph.get("nodes") or ():
        for value in (node.get("attrs") or {}).values() if isinstance(node, dict) else ():
            count += _attr_references(value)
    return count


def _attr_references(value: Any) -> int:
    if isinstance(value, list):
        return sum(_attr_references(item) for item in value)
    if isinstance(value, dict) and value.get(TAG) == "tensor":
        return 1
    if isinstance(value, dict) and value.get(TAG) == "graph":
        return _references(value.get("graph"))
    return 0
