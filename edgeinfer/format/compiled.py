"""The compiled section of an ``.eim`` (version 3.3, 3.4): a plan decided ahead of time, and the
engine-ready artifact of each part (``edgeinfer compile``, ``edgeinfer.runtime.aot``).

In the document, beside the graph::

    "compiled": {"version": 1,
                 "backends": ["onnxruntime", "numpy"],      the priority list it was placed with
                 "assignment": ["onnxruntime", ...],        the backend of every node, in order
                 "executor": "sequential", "threads": 2,    what it was compiled and measured for
                 "machine": "x86_64 AVX2,AVX-512,...",      the CPU (architecture, features)
                 "engines": {"onnxruntime": "1.32.0"},      the engine versions
                 "digest": "<sha256>",                      of the IR it was compiled from
                 "ir_sha256": "<sha256>",                   of that IR as stored (version 3.4)
                 "io": {"name", "inputs": [values],          the graph's name, inputs, outputs and
                        "outputs": [values], "nodes": N},     node count (version 3.5)
                 "parts": [{"backend", "nodes": [...], "artifact": 0 or null,
                            "inputs": [values], "outputs": [values]}],
                 "artifacts": [{"kind", "facts", "offset", "nbytes", "crc32"}],   ("sha256" before 3.6)
                 "auto": null or {"median_ms", "reason"},
                 "precision": {"precision": "bf16", "engine_options": {"openvino": {...}},   (optional:
                               "error": {output: {"sqnr_db", "max_error"}},    only where not fp32)
                               "kept_fp32": [nodes], "not_offered": {configuration: why}}}

``precision``'s engine options are applied when the file is loaded, so only the options that set
a precision are accepted (``PRECISION_OPTIONS``: OpenVINO's hint, torch's compute type, and the
nodes each keeps f32); a file carrying any other engine option is refused.

Artifact bytes follow the tensors in the data section (offsets relative to it, 64-aligned).
The digest is the SHA-256 of the document's metadata, tensor table and graph as canonical JSON:
a section whose digest is not its document's is never used. Since version 3.4 the section also holds
``"ir_sha256"``, the SHA-256 of those three as ``save_model`` stores them (``core_sha256``): a reader
hashes the stored bytes rather than encoding the parsed document again (``bound_to_ir``), and checks
``digest`` only where the file is stored otherwise. Since version 3.5 the section also copies
what a device needs of the graph (``"io"``: its name, inputs, outputs and node count), so that a
file run from its artifacts is read without parsing the graph, its tensor table or its nodes
(``format.lean``: the IR's stored bytes are hashed, not parsed); a full load checks the copy
against the graph itself. Since version 3.6 an artifact's bytes are checked by their CRC-32
(``"crc32"``; their SHA-256 before, ``"sha256"``, still read): the check is against accidental
change (a damaged, truncated or partly copied file; an artifact moved to another part), which a
CRC-32 catches as a cryptographic hash does (a file's author can write either to match any bytes),
and faster: hand_landmark_full's 5.5 MB flatbuffer in 1.3 ms, where BLAKE2b takes 6.8 and
OpenSSL's SHA-256 3.6 after 2.9 ms to import it (``benchmarks/bench_lean_load.py``). The section itself is covered by the header's SHA-256 of the document, and its bond to
the IR by ``ir_sha256``. The reader checks every field's
type and every artifact's bounds here; an artifact's own digest is checked when it is used
(``CompiledSection.artifact``), so loading a file for its IR reads no artifact byte.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

from edgeinfer.errors import ModelFormatError
from edgeinfer.format.document import DocumentReader, Finding, sha256
from edgeinfer.format.document import _value_doc as value_doc

SECTION_VERSION = 1
_FIELDS = ("version", "backends", "assignment", "executor", "threads", "machine", "engines", "digest", "parts",
           "artifacts", "auto")
_ARTIFACT_FIELDS = ("kind", "facts", "offset", "nbytes")  # and its check: "crc32" (3.6), "sha256" before
DIGESTS = {"crc32": "CRC-32", "sha256": "SHA-256"}  # an artifact's check field -> its algorithm
_IO_FIELDS = ("name", "inputs", "outputs", "nodes")
_PRECISION_FIELDS = ("precision", "engine_options", "error", "kept_fp32", "not_offered")
PRECISION_OPTIONS = {"openvino": ("precision", "fp32_nodes"), "torch": ("precision", "fp32_nodes")}
_ALIGNMENT = 64


class StoredArtifact:
    """An artifact as the file holds it: ``data`` its bytes (not yet checked), read from the file
    when first asked (``read``). Not read ahead on another thread: beside the engine's import the
    two threads' page faults contend (hand_landmark_full's 5.5 MB: LiteRT's import 6.3 ms alone,
    11.8-12.6 ms beside the read; the whole load 36 ms read in line, 38-45 ms ahead). Plain
    classes here and below: a device's cold start reads this module and imports no ``dataclasses``."""

    __slots__ = ("kind", "facts", "_data", "_read", "digest", "algorithm", "checked", "_found", "_error")

    def __init__(self, kind: str, facts: dict[str, Any], data: Any, digest: str, checked: bool = False,
                 read: Callable[[], Any] | None = None, algorithm: str = "crc32") -> None:
        self.kind, self.facts, self.digest, self.checked = kind, facts, digest, checked
        self.algorithm = algorithm  # "crc32" (version 3.6: an int) or "sha256" (a file of 3.3-3.5: hex)
        self._data, self._read = data, read
        self._found: str | None = None  # the digest of ``data``, once computed
        self._error: Exception | None = None  # why reading it failed

    @property
    def data(self) -> Any:
        self._ready()
        return self._data

    def found_digest(self) -> str:
        """The digest of its bytes as read (its ``algorithm``)."""
        self._ready()
        return self._found or self._digest_of(self._data)

    def crc32(self) -> int:
        """Its CRC-32, as version 3.6 records it (a file of 3.3-3.5 recorded its SHA-256)."""
        return self.digest if self.algorithm == "crc32" else zlib.crc32(self.data)

    def _digest_of(self, data: Any) -> Any:
        return zlib.crc32(data) if self.algorithm == "crc32" else sha256(data).hexdigest()

    def _load(self) -> None:
        """Read its bytes and their digest (where first asked)."""
        try:
            data = self._read() if self._read is not None else self._data
            self._found = self._digest_of(data)
            self._data, self._read = data, None
        except Exception as exc:  # noqa: BLE001 - said by whoever asks for the bytes
            self._error = exc

    def _ready(self) -> None:
        if self._read is not None:
            self._load()
        if self._error is not None:
            raise ModelFormatError(f"the bytes of a compiled artifact cannot be read: {self._error}")


class CompiledSection:
    """What ``edgeinfer compile`` decided and built (see the module docstring)."""

    def __init__(self, backends: list[str], assignment: list[str], executor: str, threads: int | None, machine: str,
                 engines: dict[str, str], digest: str, parts: list[dict[str, Any]],
                 artifacts: list[StoredArtifact] | None = None, auto: dict[str, Any] | None = None,
                 source: str = "", precision: dict[str, Any] | None = None) -> None:
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
        self.precision = precision  # the precision decided, where not fp32 (see the module docstring)
        self.said: set[str] = set()  # why its artifacts went unused, each said once
        self.ir_sha256: str | None = None  # the stored IR's SHA-256 (version 3.4: ``core_sha256``)
        self.io: dict[str, Any] | None = None  # the graph's name, inputs, outputs, node count (version 3.5)

    def __repr__(self) -> str:
        return (f"CompiledSection(backends={self.backends}, executor={self.executor!r}, threads={self.threads}, "
                f"machine={self.machine!r}, {len(self.parts)} parts, {len(self.artifacts)} artifacts)")

    def artifact(self, index: int) -> StoredArtifact:
        """Artifact ``index``, its bytes checked against the digest the section records."""
        stored = self.artifacts[index]
        if not stored.checked:
            try:
                found = stored.found_digest()
            except ModelFormatError as exc:
                raise ModelFormatError(f"{self.source}: compiled.artifacts[{index}]: {exc}") from None
            if found != stored.digest:
                raise ModelFormatError(f"{self.source}: compiled.artifacts[{index}]: expected bytes of "
                                       f"{DIGESTS[stored.algorithm]} {_short(stored.digest)}, found {_short(found)} "
                                       "(changed after it was written)")
            stored.checked = True
        return stored


def _short(digest: Any) -> str:
    return f"{digest:08x}" if isinstance(digest, int) else f"{digest[:16]}..."


def ir_digest(document: dict[str, Any]) -> str:
    """SHA-256 of the document's metadata, tensor table and graph (canonical JSON)."""
    core = {key: document[key] for key in ("metadata", "tensors", "graph")}
    text = json.dumps(core, ensure_ascii=True, allow_nan=False, separators=(",", ":"), sort_keys=True)
    return sha256(text.encode("ascii")).hexdigest()


def core_sha256(document: dict[str, Any]) -> str:
    """SHA-256 of the document's metadata, tensor table and graph as ``save_model`` stores them
    (compact JSON in document order): the section's ``ir_sha256`` (version 3.4)."""
    core = {key: document[key] for key in ("metadata", "tensors", "graph")}
    return sha256(_compact(core)).hexdigest()


def bound_to_ir(section: CompiledSection, text: bytes, keys: list[str], document: dict[str, Any],
                compiled: Any) -> bool:
    """Whether ``section`` was made from the IR of ``document`` (parsed from ``text``, its top-level
    ``keys`` in stored order, its compiled section ``compiled`` taken out): its ``ir_sha256``
    against the stored bytes of the IR where the file stores them as ``save_model`` writes them
    (no encoding again), else its ``digest`` against ``ir_digest``."""
    if section.ir_sha256 is not None:
        stored = _stored_core_sha256(text, keys, compiled, document["version"])
        if stored is not None:
            return stored == section.ir_sha256
    return section.digest == ir_digest(document)


def _stored_core_sha256(text: bytes, keys: list[str], compiled: Any, version: Any) -> str | None:
    """``core_sha256`` of the bytes of ``text`` that hold the IR, or None where ``text`` is not as
    ``save_model`` writes it. There, the document starts with the format and version, ends with the
    compiled section (its keys in this order, each once): with these two exactly as their compact
    encoding, the bytes between are the metadata, tensor table and graph as ``core_sha256`` encodes
    them (a JSON string cannot hold an unescaped quote, so no boundary can sit inside one)."""
    head = b'{"format":"edgeinfer-model","version":' + _compact(version) + b","
    tail = b',"compiled":' + _compact(compiled) + b"}"
    if keys != ["format", "version", "metadata", "tensors", "graph", "compiled"] or \
            len(text) < len(head) + len(tail) or not text.startswith(head) or not text.endswith(tail):
        return None
    digest = sha256(b"{", len(text))
    digest.update(memoryview(text)[len(head):len(text) - len(tail)])
    digest.update(b"}")
    return digest.hexdigest()


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


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
                        "crc32": stored.crc32()})
        placed.append((offset, stored.data))
        offset += nbytes
    parts = [{**part, "inputs": [value_doc(v, "part input") for v in part["inputs"]],
              "outputs": [value_doc(v, "part output") for v in part["outputs"]]} for part in section.parts]
    doc = {"version": SECTION_VERSION, "backends": section.backends, "assignment": section.assignment,
           "executor": section.executor, "threads": section.threads, "machine": section.machine,
           "engines": section.engines, "digest": section.digest, "parts": parts, "artifacts": entries,
           "auto": section.auto}
    if section.precision is not None:
        doc["precision"] = section.precision
    return doc, placed, offset


def read_section(obj: Any, reader: DocumentReader, data_at: Callable[[int, int], Any], data_offset: int,
                 data_length: int, tensors_end: int, nodes: int) -> CompiledSection:
    """The compiled section of a document, every field checked (``nodes``: the graph's node count;
    ``data_at(start, nbytes)``: the file's bytes there, read when an artifact's are first asked)."""
    where = "document.compiled"
    optional = tuple(name for name in ("precision", "ir_sha256", "io") if isinstance(obj, dict) and name in obj)
    obj = reader.fields(obj, where, (*_FIELDS, *optional))
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
    artifacts = [_artifact(entry, f"{where}.artifacts[{i}]", reader, data_at, data_offset, data_length, tensors_end)
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
    section = CompiledSection(list(reader.strings(obj["backends"], f"{where}.backends")), assignment,
                              reader.string(obj["executor"], f"{where}.executor"), threads,
                              reader.string(obj["machine"], f"{where}.machine"), engines, digest, parts, artifacts,
                              auto, reader.source, _precision(obj.get("precision"), reader, f"{where}.precision"))
    if "ir_sha256" in obj:
        section.ir_sha256 = reader.string(obj["ir_sha256"], f"{where}.ir_sha256", non_empty=True)
    if "io" in obj:
        section.io = graph_io(obj["io"], reader, nodes)
    return section


def io_nodes(section: Any, reader: DocumentReader) -> int | None:
    """The node count a stored section's ``io`` records (version 3.5), checked; None without one."""
    if not isinstance(section, dict) or "io" not in section:
        return None
    where = "document.compiled.io"
    return reader.integer(reader.fields(section["io"], where, _IO_FIELDS)["nodes"], f"{where}.nodes")


def _described(values: list[Any]) -> list[tuple]:
    return [(v.name, v.dtype, v.shape) for v in values]


def graph_io(obj: Any, reader: DocumentReader, nodes: int) -> dict[str, Any]:
    """The section's copy of the graph's name, inputs, outputs and node count, checked."""
    where = "document.compiled.io"
    obj = reader.fields(obj, where, _IO_FIELDS)
    if reader.integer(obj["nodes"], f"{where}.nodes") != nodes:
        raise reader.fail(f"{where}.nodes", f"the graph's node count ({nodes})", obj["nodes"])
    return {"name": reader.name(obj["name"], f"{where}.name"), "inputs": reader.values(obj["inputs"], f"{where}.inputs"),
            "outputs": reader.values(obj["outputs"], f"{where}.outputs"), "nodes": nodes}


def io_document(graph: dict[str, Any]) -> dict[str, Any]:
    """``io`` for the graph document ``graph`` (as ``save_model`` stores it)."""
    return {"name": graph["name"], "inputs": graph["inputs"], "outputs": graph["outputs"], "nodes": len(graph["nodes"])}


def check_io(section: CompiledSection, name: str, inputs: list[Any], outputs: list[Any], source: str) -> None:
    """A full read: the section's copy of the graph's name, inputs and outputs must be the graph's."""
    if section.io is None:
        return
    stored = (section.io["name"], _described(section.io["inputs"]), _described(section.io["outputs"]))
    found = (name, _described(inputs), _described(outputs))
    if stored != found:
        raise ModelFormatError(f"{source}: document.compiled.io: expected the graph's name, inputs and outputs "
                               f"{found}, found {stored}")


def _precision(obj: Any, reader: DocumentReader, where: str) -> dict[str, Any] | None:
    """The precision record, its engine options limited to those that set a precision."""
    if obj is None:
        return None
    obj = reader.fields(obj, where, _PRECISION_FIELDS)
    reader.string(obj["precision"], f"{where}.precision", non_empty=True)
    options = obj["engine_options"]
    if not isinstance(options, dict):
        raise reader.fail(f"{where}.engine_options", "an object", options)
    for backend, values in options.items():
        at = f"{where}.engine_options.{backend}"
        if not isinstance(values, dict):
            raise reader.fail(at, "an object", values)
        allowed = PRECISION_OPTIONS.get(backend, ())
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ModelFormatError(f"{reader.source}: {at}: expected only options that set a precision "
                                   f"({', '.join(allowed) or 'none for this backend'}), found {', '.join(unknown)}")
        if "precision" in values:
            reader.string(values["precision"], f"{at}.precision", non_empty=True)
        if "fp32_nodes" in values:
            reader.strings(values["fp32_nodes"], f"{at}.fp32_nodes")
    for name in ("error", "not_offered"):
        if not isinstance(obj[name], dict):
            raise reader.fail(f"{where}.{name}", "an object", obj[name])
    reader.strings(obj["kept_fp32"], f"{where}.kept_fp32")
    return obj


def _artifact(entry: Any, where: str, reader: DocumentReader, data_at: Callable[[int, int], Any], data_offset: int,
              data_length: int, tensors_end: int) -> StoredArtifact:
    algorithm = "sha256" if isinstance(entry, dict) and "sha256" in entry and "crc32" not in entry else "crc32"
    entry = reader.fields(entry, where, (*_ARTIFACT_FIELDS, algorithm))
    if not isinstance(entry["facts"], dict):
        raise reader.fail(f"{where}.facts", "an object", entry["facts"])
    offset = reader.integer(entry["offset"], f"{where}.offset", maximum=data_length)
    nbytes = reader.integer(entry["nbytes"], f"{where}.nbytes", maximum=data_length)
    if offset < tensors_end or offset + nbytes > data_length:
        raise reader.fail(where, f"bytes after the tensors (from {tensors_end}) within the {data_length}-byte "
                          "data section", Finding(f"{nbytes} bytes at offset {offset}"))
    digest = reader.integer(entry[algorithm], f"{where}.crc32", maximum=0xFFFFFFFF) if algorithm == "crc32" else \
        reader.string(entry[algorithm], f"{where}.sha256", non_empty=True)
    start = data_offset + offset
    return StoredArtifact(reader.string(entry["kind"], f"{where}.kind"), entry["facts"], None, digest,
                          read=lambda: data_at(start, nbytes), algorithm=algorithm)


def _check_disjoint(entries: list[dict[str, Any]], reader: DocumentReader, where: str) -> None:
    end = -1
    for index, entry in sorted(enumerate(entries), key=lambda item: item[1]["offset"]):
        if entry["offset"] < end:
            raise reader.fail(f"{where}.artifacts[{index}].offset", f"bytes not shared with another artifact "
                              f"(the one before ends at {end})", entry["offset"])
        end = entry["offset"] + entry["nbytes"]
