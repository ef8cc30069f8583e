"""The compiled section of an ``.eim`` (version 3.3): a plan decided ahead of time, and the
engine-ready artifact of each part (``edgeinfer compile``, ``edgeinfer.runtime.aot``).

In the document, beside the graph::

    "compiled": {"version": 1,
                 "backends": ["onnxruntime", "numpy"],      the priority list it was placed with
                 "assignment": ["onnxruntime", ...],        the backend of every node, in order
                 "executor": "sequential", "threads": 2,    what it was compiled and measured for
                 "machine": "x86_64 AVX2,AVX-512,...",      the CPU (architecture, features)
                 "engines": {"onnxruntime": "1.32.0"},      the engine versions
                 "digest": "<sha256>",                      of the IR it was compiled from
                 "parts": [{"backend", "nodes": [...], "artifact": 0 or null,
                            "inputs": [values], "outputs": [values]}],
                 "artifacts": [{"kind", "facts", "offset", "nbytes", "sha256"}],
                 "auto": null or {"median_ms", "reason"}}

Artifact bytes follow the tensors in the data section (offsets relative to it, 64-aligned).
The digest is the SHA-256 of the document's metadata, tensor table and graph as canonical JSON:
a section whose digest is not its document's is never used. The reader checks every field's
type and every artifact's bounds here; an artifact's own SHA-256 is checked when it is used
(``CompiledSection.artifact``), so loading a file for its IR reads no artifact byte.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from edgeinfer.errors import ModelFormatError
from edgeinfer.format.document import DocumentReader, Finding
from edgeinfer.format.document import _value_doc as value_doc

SECTION_VERSION = 1
_FIELDS = ("version", "backends", "assignment", "executor", "threads", "machine", "engines", "digest", "parts",
           "artifacts", "auto")
_ARTIFACT_FIELDS = ("kind", "facts", "offset", "nbytes", "sha256")
_ALIGNMENT = 64


class StoredArtifact:
    """An artifact as the file holds it: ``data`` a read-only view (not yet checked). Plain
    classes here and below: a device's cold start reads this module and imports no ``dataclasses``."""

    __slots__ = ("kind", "facts", "data", "sha256", "checked")

    def __init__(self, kind: str, facts: dict[str, Any], data: Any, sha256: str, checked: bool = False) -> None:
        self.kind, self.facts, self.data, self.sha256, self.checked = kind, facts, data, sha256, checked


class CompiledSection:
    """What ``edgeinfer compile`` decided and built (see the module docstring)."""

    def __init__(self, backends: list[str], assignment: list[str], executor: str, threads: int | None, machine: str,
                 engines: dict[str, str], digest: str, parts: list[dict[str, Any]],
                 artifacts: list[StoredArtifact] | None = None, auto: dict[str, Any] | None = None,
                 source: str = "") -> None:
        self.backends = backends
        self.assignment = assignment
        self.executor = executor
        self.threads = threads
        self.machine = machine
        self.engines = engines
        self.digest = digest
        self.parts = parts
        self.artifacts: list[StoredArtifact] = [] if artifacts is None else artifacts
        self.auto = auto
        self.source = source  # the file it was read from
        self.said: set[str] = set()  # why its artifacts went unused, each said once

    def __repr__(self) -> str:
        return (f"CompiledSection(backends={self.backends}, executor={self.executor!r}, threads={self.threads}, "
                f"machine={self.machine!r}, {len(self.parts)} parts, {len(self.artifacts)} artifacts)")

    def artifact(self, index: int) -> StoredArtifact:
        """Artifact ``index``, its bytes checked against the SHA-256 the section records."""
        stored = self.artifacts[index]
        if not stored.checked:
            found = hashlib.sha256(stored.data).hexdigest()
            if found != stored.sha256:
                raise ModelFormatError(f"{self.source}: compiled.artifacts[{index}]: expected bytes of SHA-256 "
                                       f"{stored.sha256[:16]}..., found {found[:16]}... (changed after it was written)")
            stored.checked = True
        return stored


def ir_digest(document: dict[str, Any]) -> str:
    """SHA-256 of the document's metadata, tensor table and graph (canonical JSON)."""
    core = {key: document[key] for key in ("metadata", "tensors", "graph")}
    text = json.dumps(core, ensure_ascii=True, allow_nan=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def section_document(section: CompiledSection, data_start: int) -> tuple[dict[str, Any], list[tuple[int, Any]], int]:
    """The section as a document object, with each artifact placed from ``data_start`` (the end
    of the tensors) on; returns (object, [(offset, bytes)], the data section's new length)."""
    placed = []
    entries = []
    offset = data_start
    for stored in section.artifacts:
        offset = -(-offset // _ALIGNMENT) * _ALIGNMENT
        nbytes = len(stored.data)
        entries.append({"kind": stored.kind, "facts": stored.facts, "offset": offset, "nbytes": nbytes,
                        "sha256": stored.sha256})
        placed.append((offset, stored.data))
        offset += nbytes
    parts = [{**part, "inputs": [value_doc(v, "part input") for v in part["inputs"]],
              "outputs": [value_doc(v, "part output") for v in part["outputs"]]} for part in section.parts]
    doc = {"version": SECTION_VERSION, "backends": section.backends, "assignment": section.assignment,
           "executor": section.executor, "threads": section.threads, "machine": section.machine,
           "engines": section.engines, "digest": section.digest, "parts": parts, "artifacts": entries,
           "auto": section.auto}
    return doc, placed, offset


def read_section(obj: Any, reader: DocumentReader, mapped: Any, data_offset: int, data_length: int,
                 tensors_end: int, nodes: int) -> CompiledSection:
    """The compiled section of a document, every field checked (``nodes``: the graph's node count)."""
    where = "document.compiled"
    obj = reader.fields(obj, where, _FIELDS)
    if obj["version"] != SECTION_VERSION:
        raise reader.fail(f"{where}.version", str(SECTION_VERSION), obj["version"])
    assignment = list(reader.strings(obj["assignment"], f"{where}.assignment"))
    if len(assignment) != nodes:
        raise reader.fail(f"{where}.assignment", f"one backend per node ({nodes})", Finding(f"{len(assignment)} entries"))
    threads = obj["threads"]
    if threads is not None:
        reader.integer(threads, f"{where}.threads", minimum=1, maximum=4096)
    engines = reader.str_map(obj["engines"], f"{where}.engines")
    digest = reader.string(obj["digest"], f"{where}.digest", non_empty=True)
    artifacts = [_artifact(entry, f"{where}.artifacts[{i}]", reader, mapped, data_offset, data_length, tensors_end)
                 for i, entry in enumerate(reader.array(obj["artifacts"], f"{where}.artifacts"))]
    _check_disjoint(obj["artifacts"], reader, where)
    parts = []
    for i, part in enumerate(reader.array(obj["parts"], f"{where}.parts")):
        at = f"{where}.parts[{i}]"
        part = reader.fields(part, at, ("backend", "nodes", "artifact", "inputs", "outputs"))
        indices = [reader.integer(n, f"{at}.nodes[{k}]", maximum=max(nodes - 1, 0))
                   for k, n in enumerate(reader.array(part["nodes"], f"{at}.nodes"))]
        artifact = part["artifact"]
        if artifact is not None:
            reader.integer(artifact, f"{at}.artifact", maximum=max(len(artifacts) - 1, 0))
            if not artifacts:
                raise reader.fail(f"{at}.artifact", "null (the section holds no artifact)", artifact)
        parts.append({"backend": reader.string(part["backend"], f"{at}.backend"), "nodes": indices,
                      "artifact": artifact, "inputs": reader.values(part["inputs"], f"{at}.inputs"),
                      "outputs": reader.values(part["outputs"], f"{at}.outputs")})
    auto = obj["auto"]
    if auto is not None and not isinstance(auto, dict):
        raise reader.fail(f"{where}.auto", "an object or null", auto)
    return CompiledSection(list(reader.strings(obj["backends"], f"{where}.backends")), assignment,
                           reader.string(obj["executor"], f"{where}.executor"), threads,
                           reader.string(obj["machine"], f"{where}.machine"), engines, digest, parts, artifacts, auto,
                           reader.source)


def _artifact(entry: Any, where: str, reader: DocumentReader, mapped: Any, data_offset: int, data_length: int,
              tensors_end: int) -> StoredArtifact:
    entry = reader.fields(entry, where, _ARTIFACT_FIELDS)
    if not isinstance(entry["facts"], dict):
        raise reader.fail(f"{where}.facts", "an object", entry["facts"])
    offset = reader.integer(entry["offset"], f"{where}.offset", maximum=data_length)
    nbytes = reader.integer(entry["nbytes"], f"{where}.nbytes", maximum=data_length)
    if offset < tensors_end or offset + nbytes > data_length:
        raise reader.fail(where, f"bytes after the tensors (from {tensors_end}) within the {data_length}-byte "
                          "data section", Finding(f"{nbytes} bytes at offset {offset}"))
    digest = reader.string(entry["sha256"], f"{where}.sha256", non_empty=True)
    start = data_offset + offset
    data = memoryview(mapped)[start:start + nbytes].toreadonly()
    return StoredArtifact(reader.string(entry["kind"], f"{where}.kind"), entry["facts"], data, digest)


def _check_disjoint(entries: list[dict[str, Any]], reader: DocumentReader, where: str) -> None:
    end = -1
    for index, entry in sorted(enumerate(entries), key=lambda item: item[1]["offset"]):
        if entry["offset"] < end:
            raise reader.fail(f"{where}.artifacts[{index}].offset", f"bytes not shared with another artifact "
                              f"(the one before ends at {end})", entry["offset"])
        end = entry["offset"] + entry["nbytes"]
