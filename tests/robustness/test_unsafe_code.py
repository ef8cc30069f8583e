"""Files that would run code when loaded naively: refused, and nothing runs (a payload that
would create a marker file leaves none)."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
from clicheck import cli_fails

import edgeinfer as ei
from edgeinfer.errors import ModelFormatError


class Payload:
    """Unpickling this runs ``os.system("touch <marker>")``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plain_pickle(marker: Path) -> bytes:
    return pickle.dumps({"weight": Payload(marker)}, protocol=2)


def torch_zip_pickle(marker: Path) -> bytes:
    """What torch.save writes (a zip with data.pkl), holding the payload."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(Payload(marker), protocol=2))
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/byteorder", "little")
    return buffer.getvalue()


def torchscript_lookalike(marker: Path) -> bytes:
    """A TorchScript-shaped zip whose data.pkl is a payload: torch.jit.load's restricted
    unpickler must refuse it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(Payload(marker), protocol=2))
        archive.writestr("archive/constants.pkl", pickle.dumps((), protocol=2))
        archive.writestr("archive/code/__torch__.py", "")
        archive.writestr("archive/version", "3\n")
    return buffer.getvalue()


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".pt2"])
@pytest.mark.parametrize("make", [plain_pickle, torch_zip_pickle, torchscript_lookalike])
def test_pickled_payload_is_refused_and_never_runs(tmp_path, suffix, make):
    pytest.importorskip("torch")
    marker = tmp_path / "marker"
    path = tmp_path / f"model{suffix}"
    path.write_bytes(make(marker))
    with pytest.raises(ModelFormatError) as info:
        ei.convert(path, **({"input_shapes": {"x": (1, 4)}} if suffix != ".pt2" else {}))
    assert str(path) in str(info.value)
    assert not marker.exists(), "the pickle ran"


def test_pickled_payload_through_the_cli(tmp_path):
    pytest.importorskip("torch")
    marker = tmp_path / "marker"
    path = tmp_path / "model.pt"
    path.write_bytes(torch_zip_pickle(marker))
    cli_fails(["convert", path, "-o", tmp_path / "out.eim"], "never unpickles")
    cli_fails(["inspect", path], "never unpickles")
    assert not marker.exists() and not (tmp_path / "out.eim").exists()


@pytest.mark.parametrize("damage", ["utf8 name", "multi-disk", "unknown compression", "encrypted", "bad deflate"])
def test_damaged_zip_directory_is_a_format_error(tmp_path, seeds, damage):
    """zipfile raises UnicodeDecodeError, BadZipFile from is_zipfile, NotImplementedError,
    RuntimeError, zlib.error... on such archives (found by fuzzing)."""
    raw = bytearray(seeds.data("pt"))
    end = raw.rindex(b"PK\x05\x06")
    directory = raw.index(b"PK\x01\x02")
    if damage == "utf8 name":
        raw[directory + 8] |= 0x08  # general purpose flag bit 11: names are UTF-8
        raw[directory + 46] = 0xFF  # ... and the first name byte is not
    elif damage == "multi-disk":
        raw[end - 20:end - 16] = b"PK\x06\x07"  # a zip64 locator claiming several disks
        raw[end - 16:end - 12] = b"\0\0\0\0"
        raw[end - 4:end] = b"\x05\0\0\0"
    elif damage == "unknown compression":
        raw[directory + 10:directory + 12] = b"\x63\0"  # compression method 99
    elif damage == "encrypted":
        raw[directory + 8] |= 0x01  # general purpose flag bit 0: encrypted, password required
    else:  # the first deflated member's stream
        info = next(i for i in zipfile.ZipFile(io.BytesIO(bytes(raw))).infolist() if i.compress_type == 8)
        name_length, extra_length = struct.unpack_from("<HH", raw, info.header_offset + 26)  # the local header's
        start = info.header_offset + 30 + name_length + extra_length
        raw[start:start + 4] = b"\xff\xff\xff\xff"
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match="model.pt"):
        ei.convert(path, input_shapes={"x": (2, 4)})


# Four bit flips (offset, mask) in the TorchScript seed, in data.pkl and two code files, that
# made torch.jit.load crash the process with a segmentation fault (benchmarks/fuzz_loaders.py).
SEGFAULTING_FLIPS = ((483, 0x80), (1359, 0x40), (1695, 0x10), (2145, 0x04))


def test_member_failing_its_crc_is_refused_before_torch_reads_it(tmp_path, seeds):
    """torch's archive reader skips CRC checks; edgeinfer checks them first."""
    raw = bytearray(seeds.data("pt"))
    for offset, mask in SEGFAULTING_FLIPS:
        raw[offset] ^= mask
    path = tmp_path / "tiny.pt"
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match="CRC"):
        ei.convert(path, input_shapes={"x": (2, 4)})


# -- Keras -------------------------------------------------------------------------------------------
def keras_with_config(seed: Path, out: Path, edit) -> Path:
    with zipfile.ZipFile(seed) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    edit(config)
    members["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out


def _dense(config: dict) -> dict:
    return config["config"]["layers"][1]


UNSAFE_CONFIGS = {
    "activation os.system": lambda c, cmd: _dense(c)["config"].__setitem__(
        "activation", {"module": "os", "class_name": "function", "config": "system", "registered_name": None}),
    "layer subprocess.Popen": lambda c, cmd: _dense(c).update(
        {"module": "subprocess", "class_name": "Popen", "registered_name": None, "config": {"args": cmd}}),
    "initializer builtins.exec": lambda c, cmd: _dense(c)["config"].__setitem__(
        "kernel_initializer", {"module": "builtins", "class_name": "function", "config": "exec",
                               "registered_name": None}),
    "model os.system": lambda c, cmd: c.update({"module": "os", "class_name": "system", "config": cmd}),
    "lambda bytecode": lambda c, cmd: _dense(c).update(
        {"module": "keras.layers", "class_name": "Lambda", "registered_name": None,
         "config": {"name": "l", "function": {"class_name": "__lambda__",
                                              "config": {"code": "", "defaults": None, "closure": None}}}}),
}


@pytest.mark.parametrize("case", sorted(UNSAFE_CONFIGS))
def test_keras_config_naming_code_outside_keras_is_refused(tmp_path, seeds, case):
    marker = tmp_path / "marker"
    path = keras_with_config(seeds.path("keras"), tmp_path / "model.keras",
                             lambda config: UNSAFE_CONFIGS[case](config, f"touch {marker}"))
    with pytest.raises(ModelFormatError, match="refused to load") as info:
        ei.convert(path)
    assert str(path) in str(info.value)
    assert not marker.exists()


def test_keras_lambda_layer_is_refused_and_never_runs(tmp_path):
    keras = pytest.importorskip("keras")
    marker = tmp_path / "marker"

    def touch(tensor):
        marker.touch()
        return tensor * 2.0

    inputs = keras.Input((4,))
    path = tmp_path / "lambda.keras"
    keras.Model(inputs, keras.layers.Lambda(touch)(inputs)).save(path)
    marker.unlink()  # building the model ran the function once, here, in the test
    with pytest.raises(ModelFormatError, match="refused to load"):
        ei.convert(path)
    assert not marker.exists()


def test_keras_with_a_registered_custom_object_is_not_refused_by_the_check(tmp_path, seeds):
    keras = pytest.importorskip("keras")
    from edgeinfer.converters.tensorflow import check_keras_config

    @keras.saving.register_keras_serializable(package="robustness_test")
    class Doubler(keras.layers.Layer):
        def call(self, tensor):
            return tensor * 2.0

    inputs = keras.Input((4,))
    path = tmp_path / "custom.keras"
    keras.Model(inputs, Doubler()(inputs)).save(path)
    check_keras_config(path)  # no error: the object is registered in this process


def test_keras_archive_with_an_encrypted_config(tmp_path, seeds):
    raw = bytearray(seeds.data("keras"))
    archive = zipfile.ZipFile(io.BytesIO(bytes(raw)))
    directory = raw.index(b"PK\x01\x02")
    for info in archive.infolist():  # set the encrypted flag of config.json in the central directory
        entry = raw.index(b"PK\x01\x02", directory)
        if raw[entry + 46:entry + 46 + len(info.filename)] == info.filename.encode() and info.filename == "config.json":
            raw[entry + 8] |= 0x01
        directory = entry + 1
    path = tmp_path / "model.keras"
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match="encrypted"):
        ei.convert(path)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04broken", b"not a zip at all"])
def test_broken_keras_archive(tmp_path, content):
    pytest.importorskip("keras")
    path = tmp_path / "broken.keras"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match="broken.keras"):
        ei.convert(path)
