"""Writers (.eim save, ONNX export, TFLite export) facing a missing folder, a symlink or a
directory at the target, and a full disk: a typed error naming the path, no partial or
temporary file left behind, an existing file unchanged."""

from __future__ import annotations

import errno
import os

import pytest
from clicheck import cli_fails

import edgeinfer as ei
from edgeinfer.errors import EdgeInferError
from edgeinfer.format import atomic

WRITERS = {
    ".eim": lambda model, path: model.save(path),
    ".onnx": lambda model, path: ei.export(model, path),
    ".tflite": lambda model, path: ei.export(model, path),
}


@pytest.fixture(scope="module")
def model(seeds):
    return ei.convert(seeds.path("onnx"), input_shapes={"x": (1, 4)})


def listing(folder) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in os.listdir(folder) if (folder / name).is_file()}


@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_missing_folder(model, tmp_path, suffix):
    target = tmp_path / "absent" / f"out{suffix}"
    with pytest.raises(EdgeInferError, match="does not exist"):
        WRITERS[suffix](model, target)
    assert not target.parent.exists()


@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_target_is_a_symlink(model, tmp_path, suffix):
    elsewhere = tmp_path / "precious.bin"
    elsewhere.write_bytes(b"keep me")
    target = tmp_path / f"out{suffix}"
    target.symlink_to(elsewhere)
    with pytest.raises(EdgeInferError, match="symbolic link"):
        WRITERS[suffix](model, target)
    assert target.is_symlink() and elsewhere.read_bytes() == b"keep me"
    assert sorted(os.listdir(tmp_path)) == sorted(["precious.bin", f"out{suffix}"])


@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_target_is_a_directory(model, tmp_path, suffix):
    target = tmp_path / f"out{suffix}"
    target.mkdir()
    with pytest.raises(EdgeInferError, match="directory"):
        WRITERS[suffix](model, target)
    assert target.is_dir()


class FullDisk:
    """A file handle whose writes stop with ENOSPC after ``room`` bytes."""

    def __init__(self, handle, room: int):
        self.handle, self.room = handle, room

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= size
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


@pytest.mark.parametrize("where", ["write", "fsync"])
@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_disk_full_leaves_the_existing_file_intact(model, tmp_path, monkeypatch, suffix, where):
    target = tmp_path / f"out{suffix}"
    target.write_bytes(b"the previous model")
    before = listing(tmp_path)
    real_fdopen = os.fdopen
    if where == "write":
        monkeypatch.setattr(atomic.os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode), 100))
    else:
        def no_space(fd):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(atomic.os, "fsync", no_space)
    with pytest.raises(EdgeInferError, match="No space left on device") as info:
        WRITERS[suffix](model, target)
    assert str(target) in str(info.value) and "unchanged" in str(info.value)
    assert listing(tmp_path) == before  # the old bytes, and no temporary file left


@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_disk_full_on_a_new_file_leaves_nothing(model, tmp_path, monkeypatch, suffix):
    real_fdopen = os.fdopen
    monkeypatch.setattr(atomic.os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode), 10))
    with pytest.raises(EdgeInferError, match="No space left on device"):
        WRITERS[suffix](model, tmp_path / f"new{suffix}")
    assert os.listdir(tmp_path) == []


def test_read_only_folder(model, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(EdgeInferError, match="cannot write"):
            model.save(tmp_path / "out.eim")
    finally:
        tmp_path.chmod(0o700)


def test_writes_still_work_and_replace_a_file(model, tmp_path):
    for suffix, write in WRITERS.items():
        target = tmp_path / f"out{suffix}"
        target.write_bytes(b"old")
        write(model, target)
        assert target.stat().st_size > 100 and not target.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["out.eim", "out.onnx", "out.tflite"]


def test_cli_output_problems_are_one_line(seeds, tmp_path):
    source = seeds.path("onnx")
    cli_fails(["convert", source, "-o", tmp_path / "absent" / "out.eim"], "does not exist")
    (tmp_path / "link.eim").symlink_to(tmp_path / "elsewhere.eim")
    cli_fails(["convert", source, "-o", tmp_path / "link.eim"], "symbolic link")
    eim = tmp_path / "m.eim"
    ei.convert(source, input_shapes={"x": (1, 4)}).save(eim)
    for suffix in (".onnx", ".tflite"):
        (tmp_path / f"link{suffix}").symlink_to(tmp_path / f"elsewhere{suffix}")
        cli_fails(["export", eim, "-o", tmp_path / f"link{suffix}"], "symbolic link")
        cli_fails(["export", eim, "-o", tmp_path / "absent" / f"out{suffix}"], "does not exist")
    assert not any(name.startswith("elsewhere") for name in os.listdir(tmp_path))
