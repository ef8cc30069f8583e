"""What a PyTorch file is, decided without running any of it.

``torch.save`` writes pickles, and unpickling runs code chosen by whoever wrote the file. So a
file is classified from its zip directory and its JSON configs only:

- TorchScript (``torch.jit.save``): a zip with ``code/``, ``constants.pkl`` and ``data.pkl``.
  ``torch.jit.load`` reads it with TorchScript's own restricted unpickler, which rebuilds
  TorchScript types only; it cannot call arbitrary Python.
- ExportedProgram (``torch.export.save``, ``.pt2``): a zip with ``archive_version`` and
  ``models/*.json``. ``torch.export.load`` falls back to full unpickling for some payloads
  (tensor subclasses, custom and opaque objects, legacy weight files, sample inputs that the
  restricted loader rejects) and loads AOTInductor shared libraries; archives holding any of
  those are refused before ``torch.export.load`` sees them.
- Anything else pickled (a whole module or a state dict from ``torch.save``) is refused with
  a message saying how to save a TorchScript or ExportedProgram instead. ``pickletools``
  reads the opcodes (it never executes them) to say which of the two it is.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import zipfile
import zlib
from pathlib import Path

from edgeinfer import limits
from edgeinfer.errors import ModelFormatError
from edgeinfer.limits import MAX_TEXT_BYTES

TORCHSCRIPT = "torchscript"
EXPORTED_PROGRAM = "exported_program"

HOW_TO_SAVE = ("save an ExportedProgram with torch.export.save(torch.export.export(model.eval(), "
               "(example_input,)), 'model.pt2') or TorchScript with torch.jit.save(torch.jit.script(model), "
               "'model.pt'), or pass the nn.Module itself to edgeinfer.convert(module, example_inputs=...)")
_STATE_DICT_GLOBALS = ("collections", "torch._utils", "torch.storage", "torch.serialization", "torch._tensor",
                       "builtins", "_codecs", "numpy")


def classify(path: str | os.PathLike) -> str:
    """``TORCHSCRIPT`` or ``EXPORTED_PROGRAM``; any other file raises ``ModelFormatError``."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"{path}: expected a PyTorch model file, found no such file")
    if path.stat().st_size == 0:
        raise ModelFormatError(f"{path}: expected a PyTorch model file, found an empty file")
    try:
        return _classify_file(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, UnicodeDecodeError, EOFError,
            ValueError, OSError, zlib.error, RuntimeError) as exc:  # zipfile's ways of refusing a damaged
        # archive, found by fuzzing (RuntimeError: a member flagged as encrypted)
        raise ModelFormatError(f"{path}: corrupt zip archive ({type(exc).__name__}: {str(exc)[:200]})") from None


def _classify_file(path: Path) -> str:
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as handle:
            head = handle.read(2)
        if head[:1] == b"\x80":
            raise ModelFormatError(f"{path}: a plain pickle (legacy torch.save format) can hold arbitrary code "
                                   f"and is never loaded; {HOW_TO_SAVE}")
        raise ModelFormatError(f"{path}: expected a TorchScript or ExportedProgram zip archive, found neither "
                               "a zip file nor a pickle")
    with zipfile.ZipFile(path) as archive:
        names = _relative_names(archive.namelist())
        _check_crcs(archive, path)
        if "archive_version" in names and any(n.startswith("models/") and n.endswith(".json") for n in names):
            check_exported_program_archive(archive, path)
            return EXPORTED_PROGRAM
        if "constants.pkl" in names and "data.pkl" in names and any(n.startswith("code/") for n in names):
            return TORCHSCRIPT
        if "data.pkl" in names:
            raise ModelFormatError(f"{path}: {_describe_pickle(archive, names)}, which edgeinfer never "
                                   f"unpickles (that can run arbitrary code); {HOW_TO_SAVE}")
    raise ModelFormatError(f"{path}: a zip archive that is neither TorchScript (code/, constants.pkl) nor an "
                           "ExportedProgram (archive_version, models/*.json)")


def _check_crcs(archive: zipfile.ZipFile, path: Path) -> None:
    """Every member must match its CRC-32. torch's archive reader does not check them, and a
    damaged data.pkl or code file can crash the process inside ``torch.jit.load`` (a
    segmentation fault found by fuzzing); reading each member once here costs about one read
    of the file."""
    for info in archive.infolist():
        if info.file_size > limits.MAX_FILE_BYTES:
            raise ModelFormatError(f"{path}: archive member {info.filename!r} inflates to {info.file_size} bytes, "
                                   f"expected at most {limits.MAX_FILE_BYTES}")
        with archive.open(info) as member:
            while member.read(1 << 24):  # zipfile raises BadZipFile at the end on a CRC mismatch
                pass


def _relative_names(names: list[str]) -> dict[str, str]:
    """Archive member names without the archive's root folder -> full member names."""
    relative = {}
    for name in names:
        _, _, rest = name.partition("/")
        relative[rest or name] = name
    return relative


def _describe_pickle(archive: zipfile.ZipFile, names: dict[str, str]) -> str:
    """'a pickled torch.nn.Module (pkg.Class)' or 'a state dict', from the opcodes alone."""
    classes = []
    try:
        strings: list[str] = []
        if archive.getinfo(names["data.pkl"]).file_size > MAX_TEXT_BYTES:
            return "a pickle written by torch.save"
        for opcode, arg, _ in pickletools.genops(io.BytesIO(archive.read(names["data.pkl"]))):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strings.append(arg)
            elif opcode.name == "GLOBAL":
                classes.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                classes.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # a damaged pickle: describe it generically
        return "a pickle written by torch.save"
    user_classes = [c for c in classes if not (c.startswith(_STATE_DICT_GLOBALS)
                                               or (c.startswith("torch.") and c.endswith("Storage")))]
    if user_classes:
        return f"a pickled Python object written by torch.save (class {user_classes[0]})"
    return ("a state dict written by torch.save (weights without the model's code: rebuild the module in "
            "Python and load it with model.load_state_dict(torch.load(path, weights_only=True)))")


def check_exported_program_archive(archive: zipfile.ZipFile, path: Path) -> None:
    """Refuse ``.pt2`` archives that ``torch.export.load`` would unpickle or dlopen."""
    from torch.export.pt2_archive import constants as pt2

    names = _relative_names(archive.namelist())

    def refuse(what: str) -> ModelFormatError:
        return ModelFormatError(f"{path}: the ExportedProgram archive holds {what}, which loading would execute; "
                                "edgeinfer converts archives of plain tensors and graphs only (re-save with "
                                "torch.export.save from an exported program without custom objects)")

    for name in names:
        if name.startswith((pt2.AOTINDUCTOR_DIR, pt2.MTIA_DIR, pt2.EXECUTORCH_DIR)):
            raise refuse(f"compiled code ({name})")
    models = [n[len(pt2.MODELS_DIR):-len(".json")] for n in names
              if n.startswith(pt2.MODELS_DIR) and n.endswith(".json")]
    for model in models:
        for legacy in (f"{pt2.WEIGHTS_DIR}{model}.pt", f"{pt2.CONSTANTS_DIR}{model}.pt"):
            if legacy in names:
                raise refuse(f"pickled weights in the legacy format ({legacy})")
        for config_name in (pt2.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model),
                            pt2.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model)):
            if config_name not in names:
                raise ModelFormatError(f"{path}: ExportedProgram archive lacks {config_name}")
            if archive.getinfo(names[config_name]).file_size > MAX_TEXT_BYTES:
                raise ModelFormatError(f"{path}: {config_name} inflates to more than {MAX_TEXT_BYTES} bytes")
            for fqn, payload in _payloads(archive.read(names[config_name]), path, config_name):
                if payload.get("use_pickle"):
                    raise refuse(f"a pickled tensor ({fqn})")
                if str(payload.get("path_name", "")).startswith(
                        (pt2.CUSTOM_OBJ_FILENAME_PREFIX, pt2.OPAQUE_OBJ_FILENAME_PREFIX)):
                    raise refuse(f"a pickled custom object ({fqn})")
        sample = pt2.SAMPLE_INPUTS_FILENAME_FORMAT.format(model)
        if sample in names:
            _check_sample_inputs(archive.read(names[sample]), path, refuse)


def _payloads(raw: bytes, path: Path, config_name: str):
    try:
        config = json.loads(raw)["config"]
        return [(str(fqn), dict(payload)) for fqn, payload in config.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelFormatError(f"{path}: {config_name} is not a valid payload config ({exc})") from exc


def _check_sample_inputs(raw: bytes, path: Path, refuse) -> None:
    """``torch.export.load`` retries sample inputs with full unpickling if the restricted loader
    fails; make sure the restricted loader succeeds so that fallback never happens."""
    if not raw:
        return
    import torch

    try:
        torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as exc:
        raise refuse("sample inputs that only full unpickling can read") from exc
