"""Atomic file writes: a temporary file in the target's folder, fsync, then rename.

A failed or interrupted write leaves no partial file and leaves an existing file untouched.
A target that is a symbolic link is refused (writing would either replace the link or, through
it, a file elsewhere; neither is what the caller asked for). An ``OSError`` (disk full,
permission denied, read-only file system) becomes a ``ModelFormatError`` naming the target,
as ``save_model`` has always reported it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from edgeinfer.errors import EdgeInferError, ModelFormatError


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(handle)`` on a temporary file and move it to ``path`` only on success."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise EdgeInferError(f"{target}: cannot write, folder {folder} does not exist")
    if target.is_symlink():
        raise ModelFormatError(f"{target}: cannot write, the path is a symbolic link (to {os.readlink(target)}); "
                             "expected a regular file or a new name")
    if target.is_dir():
        raise ModelFormatError(f"{target}: cannot write, the path is a directory; expected a file name")
    try:
        import tempfile  # here: loading a model for a device writes nothing (3.7 ms of imports)

        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ModelFormatError(f"{target}: cannot write in {folder}: {exc.strerror or exc}") from exc
    try:
        _chmod_like_a_new_file(fd, target)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException as exc:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise ModelFormatError(f"{target}: cannot write: {exc.strerror or exc}; nothing was written"
                                 + (" and the existing file is unchanged" if target.exists() else "")) from exc
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _chmod_like_a_new_file(fd: int, target: Path) -> None:
    """mkstemp creates files readable by their owner only; give the result the mode of the file
    it replaces, or else the mode ``open()`` would give a new file (0o666 less the umask)."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        os.fchmod(fd, mode)
    except (AttributeError, OSError):  # no fchmod (Windows) or a file system without modes
        pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data))
