"""Weights that live in a memory-mapped file, and where in that file.

The ``.eim`` loader (and the ONNX external-data reader) map a file read-only and make every
weight a numpy view into the map. They register each map here (``register_mapped_file``) with
the file's real path and identity, so that a backend whose engine can read weights from a file
by itself (onnxruntime's external data) can ask ``file_span(array)`` where an initializer's
bytes are and point the engine at them instead of handing over the array: the engine then maps
the file itself and no copy is made.

``file_span`` answers only for a C-contiguous array whose memory is the registered map's
memory, and only while the file at that path is still the file that was mapped (same device,
inode, size and modification time): a model saved over the same path (``save_model`` writes a
new file and renames it) makes its answer None, and the caller keeps the array in memory.
Registrations are weak: they go when the map goes.

``release_pages(array)`` tells the kernel that the pages of a mapped, read-only weight are not
needed for now (``madvise(MADV_DONTNEED)``): they leave the process's resident memory and are
read again from the page cache (or the file) when next touched, so a pass that streams over
big weights (weight-only quantization, the content hash) holds one slab at a time, not the file.
Dropping the pages of a read-only map loses nothing; a writable (copy-on-write) map is left alone.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import NamedTuple

import numpy as np


class FileSpan(NamedTuple):
    """An array's bytes in a file: ``nbytes`` bytes from ``offset`` of the file at ``path``."""

    path: str  # the file's real path (symlinks resolved when it was mapped)
    offset: int
    nbytes: int
    identity: tuple[int, int, int, int]  # the mapped file's (device, inode, size, mtime)

    def unchanged(self) -> bool:
        """Whether the file at ``path`` is still the file that was mapped."""
        return file_identity(self.path) == self.identity


class _MappedFile(NamedTuple):
    ref: weakref.ref
    path: str
    file_offset: int  # where in the file the map's first byte is
    address: int  # the map's first byte in memory
    length: int
    identity: tuple[int, int, int, int]


_MAPS: dict[int, _MappedFile] = {}
_LOCK = threading.Lock()


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def register_mapped_file(mapped: mmap.mmap, path: str | os.PathLike, info: os.stat_result,
                         file_offset: int = 0) -> None:
    """Record that ``mapped`` maps the file at ``path`` (whose ``os.fstat`` is ``info``) from
    byte ``file_offset`` on."""
    if len(mapped) == 0:
        return
    probe = np.frombuffer(mapped, dtype=np.uint8, count=1)
    address = probe.ctypes.data
    del probe  # the map must stay closable
    key = id(mapped)

    def forget(_ref: weakref.ref, key: int = key) -> None:
        with _LOCK:
            if _MAPS.get(key) is not None and _MAPS[key].ref is _ref:
                del _MAPS[key]

    entry = _MappedFile(weakref.ref(mapped, forget), os.path.realpath(os.fspath(path)), int(file_offset),
                        address, len(mapped), _identity(info))
    with _LOCK:
        _MAPS[key] = entry


def _owner(array: np.ndarray) -> object | None:
    """The object at the end of ``array``'s base chain (a memoryview's exporter included)."""
    obj: object = array
    while isinstance(obj, np.ndarray):
        if obj.base is None:
            return None
        obj = obj.base
    while isinstance(obj, memoryview):
        obj = obj.obj
    return obj


def file_span(array: np.ndarray) -> FileSpan | None:
    """Where ``array``'s bytes are in a registered, still unchanged mapped file; None if they
    are not (a copy, a strided view, an unregistered map, a file replaced or changed since)."""
    if not isinstance(array, np.ndarray) or array.nbytes == 0 or not array.flags.c_contiguous:
        return None
    owner = _owner(array)
    if not isinstance(owner, mmap.mmap):
        return None
    with _LOCK:
        entry = _MAPS.get(id(owner))
    if entry is None or entry.ref() is not owner:
        return None
    start = array.ctypes.data - entry.address
    if start < 0 or start + array.nbytes > entry.length:
        return None
    span = FileSpan(entry.path, entry.file_offset + start, int(array.nbytes), entry.identity)
    return span if span.unchanged() else None


def release_pages(array: np.ndarray) -> bool:
    """Drop from resident memory the pages wholly inside ``array``'s bytes, where ``array`` is
    a contiguous view of a registered read-only map (else do nothing); whether any were."""
    if not isinstance(array, np.ndarray) or array.nbytes == 0:
        return False
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        return False
    owner = _owner(array)
    if not isinstance(owner, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    with _LOCK:
        entry = _MAPS.get(id(owner))
    if entry is None or entry.ref() is not owner:
        return False
    try:
        with memoryview(owner) as view:
            if not view.readonly:  # a private writable map: its pages may hold writes
                return False
    except ValueError:  # closed
        return False
    start = array.ctypes.data - entry.address
    if start < 0 or start + array.nbytes > entry.length:
        return False
    page = mmap.PAGESIZE
    low, high = -(-start // page) * page, (start + array.nbytes) // page * page  # whole pages only
    if high <= low:
        return False
    owner.madvise(mmap.MADV_DONTNEED, low, high - low)
    return True


def file_identity(path: str) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime) of the file at ``path`` now, or None if it cannot be read."""
    try:
        return _identity(os.stat(path))
    except OSError:
        return None

