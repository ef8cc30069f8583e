"""Keras model files: ``.keras`` archives and legacy HDF5 (``.h5``/``.hdf5``) files, loaded
with safe-mode semantics.

Both formats describe the model as a JSON config of ``{"class_name": ..., "config": ...}``
objects that Keras turns into Python objects. Before Keras sees a file, its config is read
here and refused if it names code that loading would run: a Lambda layer (Python bytecode),
or a class from a module other than Keras that is not registered in this process. The check
does not depend on the Keras version's own safe mode. The file is read, never written, and
nothing beside it is touched.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

from edgeinfer.errors import ModelFormatError, first_line
from edgeinfer.limits import MAX_TEXT_BYTES

ARCHIVE_SUFFIXES = (".keras",)
HDF5_SUFFIXES = (".h5", ".hdf5")
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# Class names that a legacy (HDF5) config resolves inside Keras without a public name.
_LEGACY_KERAS_CLASSES = frozenset({"Functional"})
_PUBLIC_NAMESPACES = ("layers", "models", "initializers", "regularizers", "constraints", "activations",
                      "dtype_policies", "mixed_precision", "losses", "metrics", "optimizers")
_LAMBDA_REFUSAL = ("refused to load: the model contains a Lambda layer (Python bytecode that Keras runs only "
                   "with safe_mode=False); replace it with a registered custom layer, or load the model "
                   "yourself if you trust the file and pass the keras.Model object")


def is_hdf5(path: Path) -> bool:
    """Whether the file starts with the HDF5 signature (a user block before it is not looked for)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(HDF5_MAGIC)) == HDF5_MAGIC
    except OSError:
        return False


def load_keras_file(path: Path):
    """A ``keras.Model`` from a ``.keras`` archive or a legacy HDF5 file (recognised by content,
    then by suffix), after ``check_keras_config``/``check_hdf5_config``; unsafe content is refused."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"{path}: expected a Keras model file (.keras, .h5, .hdf5), found no such file")
    if is_hdf5(path) or (path.suffix.lower() in HDF5_SUFFIXES and not zipfile.is_zipfile(path)):
        return _load_hdf5(path)
    check_keras_config(path)
    if path.suffix.lower() not in ARCHIVE_SUFFIXES:  # recognised by content; Keras goes by the name
        import tempfile

        with tempfile.TemporaryDirectory(prefix="edgeinfer_keras_") as folder:
            link = Path(folder) / "model.keras"
            link.symlink_to(path.resolve())
            return _load_archive(link, path)
    return _load_archive(path, path)


def _load_archive(path: Path, where: Path):
    import keras

    try:
        return keras.saving.load_model(os.fspath(path), safe_mode=True, compile=False)
    except ValueError as exc:
        message = str(exc)
        if "safe_mode" in message or "Lambda" in message or "arbitrary code" in message:
            raise ModelFormatError(
                f"{where}: refused to load: the model contains Python code (a Lambda layer or another "
                "unsafe object) that Keras will only deserialize with safe_mode=False, which would "
                "run code from the file. Replace the Lambda with a registered custom layer, or load "
                "the model yourself if you trust the file and pass the keras.Model object") from exc
        raise ModelFormatError(f"{where}: Keras cannot load the file: {message.splitlines()[0][:300]}") from exc
    except Exception as exc:  # zipfile.BadZipFile, OSError, KeyError and Keras' own errors on damaged archives
        raise ModelFormatError(f"{where}: not a readable .keras archive ({_described(exc)})") from exc


def check_keras_config(path: Path) -> None:
    """Refuse a ``.keras`` archive whose config names code outside Keras, before Keras reads it.

    Keras resolves every ``{"module": ..., "class_name": ...}`` object of ``config.json`` by
    importing the module; ``safe_mode`` stops lambdas, and recent Keras releases also restrict
    modules, but this check does not depend on the Keras version: an object must come from
    ``keras`` itself or be a custom object registered in this process, and no ``__lambda__``
    may appear anywhere.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("config.json")
            if info.file_size > MAX_TEXT_BYTES:
                raise ModelFormatError(f"{path}: config.json inflates to {info.file_size} bytes, expected at most "
                                       f"{MAX_TEXT_BYTES}")
            config = json.loads(archive.read(info))
    except ModelFormatError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, RecursionError, OSError, EOFError, NotImplementedError,
            RuntimeError, zlib.error) as exc:  # RuntimeError: a member flagged as encrypted (found by fuzzing)
        raise ModelFormatError(f"{path}: expected a .keras archive with a JSON config.json, cannot read it "
                               f"({type(exc).__name__}: {str(exc)[:200]})") from None
    refuse_unsafe_objects(config, path, where="config.json", legacy=False)


def check_hdf5_config(handle, path: Path) -> Any:
    """The parsed ``model_config`` of an open HDF5 file, refused (``ModelFormatError``) where it
    names a Lambda layer or a class that is neither Keras' own nor registered in this process."""
    if "model_config" not in handle.attrs:
        raise ModelFormatError(f"{path}: expected a Keras model saved with model.save() (an HDF5 file with a "
                               "model_config attribute); found none: a weights-only file (save_weights) or "
                               "other HDF5 data. Build the model in code and load the weights into it, then "
                               "pass the keras.Model object")
    size = handle.attrs.get_id("model_config").get_storage_size()
    if size > MAX_TEXT_BYTES:
        raise ModelFormatError(f"{path}: model_config holds {size} bytes, expected at most {MAX_TEXT_BYTES}")
    raw = handle.attrs["model_config"]
    try:
        config = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    except (ValueError, RecursionError) as exc:
        raise ModelFormatError(f"{path}: model_config is not JSON ({_described(exc)})") from None
    refuse_unsafe_objects(config, path, where="model_config", legacy=True)
    return config


def refuse_unsafe_objects(config: Any, path: Path, *, where: str, legacy: bool) -> None:
    """Raise ``ModelFormatError`` for the first object of ``config`` that loading would turn
    into code from the file or from outside Keras.

    Refused everywhere: ``__lambda__`` objects (bytecode), and a ``module`` other than
    ``keras``/``keras.*`` unless the object is registered in this process. ``legacy`` (HDF5
    configs, whose layers carry no module) also refuses every ``Lambda`` layer, whose
    ``function`` is marshalled bytecode, and any class name that Keras does not know and
    nobody registered.
    """
    import keras

    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        stack.extend(item.values())
        class_name = item.get("class_name")
        if class_name == "__lambda__" or (legacy and class_name == "Lambda"):
            raise ModelFormatError(f"{path}: {_LAMBDA_REFUSAL}")
        module = item.get("module")
        if _registered(keras, item.get("registered_name")) or (legacy and module is None
                                                               and _registered(keras, class_name)):
            continue
        if isinstance(module, str) and (module == "keras" or module.startswith("keras.")):
            continue
        if module is not None:
            raise ModelFormatError(f"{path}: refused to load: {where} names {class_name!r} from module {module!r}; "
                                   "expected objects from keras or custom objects registered in this process "
                                   "(loading would import and call that module's code)")
        if legacy and _unknown_legacy_class(keras, item):
            raise ModelFormatError(f"{path}: refused to load: {where} names class {class_name!r}, which is neither "
                                   f"a Keras {keras.__version__} class nor a custom object registered in this "
                                   "process; register it (keras.saving.register_keras_serializable) before "
                                   "converting, or pass the loaded keras.Model object")


def _registered(keras, name: Any) -> bool:
    return isinstance(name, str) and keras.saving.get_registered_object(name) is not None


def _unknown_legacy_class(keras, item: dict) -> bool:
    """A legacy layer-like object (``class_name`` and ``config``) whose class Keras does not have."""
    class_name = item.get("class_name")
    if not isinstance(class_name, str) or "config" not in item or class_name.startswith("__"):
        return False  # serialisation markers (__tuple__, __keras_tensor__, ...) are data, not classes
    if class_name in _LEGACY_KERAS_CLASSES:
        return False
    return not any(hasattr(getattr(keras, namespace, None), class_name) for namespace in _PUBLIC_NAMESPACES)


def _load_hdf5(path: Path):
    """Check the config, then let Keras' legacy HDF5 loader build the model from the same open file."""
    import h5py

    try:
        handle = h5py.File(path, mode="r")
    except Exception as exc:  # OSError on a truncated or damaged file
        raise ModelFormatError(f"{path}: not a readable HDF5 file ({_described(exc)})") from None
    with handle:
        try:
            check_hdf5_config(handle, path)
        except ModelFormatError:
            raise
        except Exception as exc:  # an unreadable attribute of a damaged file
            raise ModelFormatError(f"{path}: cannot read the HDF5 model_config ({_described(exc)})") from None
        return _deserialize_hdf5(handle, path)


def _deserialize_hdf5(handle, path: Path):
    try:  # the loader Keras' own load_model uses for .h5 names; it takes an open h5py.File
        from keras.src.legacy.saving.legacy_h5_format import load_model_from_hdf5
    except ImportError as exc:
        raise ModelFormatError(f"{path}: this Keras cannot read legacy HDF5 models ({_described(exc)}); "
                               "expected Keras 3") from exc
    try:
        return load_model_from_hdf5(handle, compile=False, safe_mode=True)
    except Exception as exc:  # truncated weights, unknown layers, configs Keras 3 cannot rebuild
        raise ModelFormatError(f"{path}: Keras cannot load the HDF5 model: {_described(exc)}") from exc


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc, 300)}"


__all__ = ["ARCHIVE_SUFFIXES", "HDF5_SUFFIXES", "check_hdf5_config", "check_keras_config", "is_hdf5",
           "load_keras_file", "refuse_unsafe_objects"]
