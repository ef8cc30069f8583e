"""Calibration and evaluation data: a folder of ``.npy``/``.npz`` files, a folder of images,
a Python iterable, or (only when asked for explicitly) random data.

Every source becomes an iterator of feed dicts ``{input name: array}`` shaped for the model:
an array without the batch dim gets one, and an array whose batch is a multiple of the
model's fixed batch is split into model-sized pieces. Images are read with OpenCV
(``opencv-python-headless``), resized to ``size``, converted BGR -> RGB, scaled to [0, 1],
normalized with ``(x - mean) / std`` per channel and laid out NCHW (or NHWC).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.ir import Graph, dtypes

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
Feeds = dict[str, np.ndarray]


class RandomCalibrationWarning(UserWarning):
    """Calibrating on random data: the ranges say nothing about real inputs."""


def npy_folder(path: str | os.PathLike, graph: Graph) -> Iterator[Feeds]:
    """Feeds from ``*.npy`` files (one input models) or ``*.npz`` files whose keys are input
    names, in file-name order."""
    folder = _folder(path, "calibration data")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".npy", ".npz"))
    if not files:
        raise InputError(f"calibration folder {folder}: expected .npy or .npz files, found none")
    for file in files:
        yield from npy_file(file, graph)


def npy_file(file: str | os.PathLike, graph: Graph) -> Iterator[Feeds]:
    """Feeds from one ``.npy`` (a one-input model) or ``.npz`` file (keys = input names)."""
    names = graph.input_names
    try:
        loaded = np.load(file, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"calibration file {file}: not a readable .npy/.npz without pickles ({exc})") from exc
    if isinstance(loaded, np.ndarray):
        if len(names) != 1:
            raise InputError(f"calibration file {file}: a .npy holds one array but the model has inputs "
                             f"{names}; use .npz files keyed by input name")
        yield from shape_feeds({names[0]: loaded}, graph, where=str(file))
    else:
        with loaded:
            yield from shape_feeds({key: loaded[key] for key in loaded.files}, graph, where=str(file))


def image_folder(path: str | os.PathLike, graph: Graph, *, size: Sequence[int] | None = None,
                 mean: Sequence[float] = (0.0, 0.0, 0.0), std: Sequence[float] = (1.0, 1.0, 1.0),
                 layout: str | None = None) -> Iterator[Feeds]:
    """Feeds from the images of a folder (sorted by name) for a one-input image model.

    ``size`` is (height, width) (default: the input's declared spatial size); ``layout`` is
    "NCHW" or "NHWC" (default: guessed from where the input has 1 or 3 channels)."""
    folder = _folder(path, "image")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"image folder {folder}: expected images ({', '.join(IMAGE_SUFFIXES)}), found none")
    if len(graph.inputs) != 1:
        raise InputError(f"image calibration: expected a model with one input, found {graph.input_names}")
    for file in files:
        pixels = image_array(file, graph.inputs[0], size=size, mean=mean, std=std, layout=layout)
        yield from shape_feeds({graph.inputs[0].name: pixels}, graph, where=str(file))


def image_array(file: str | os.PathLike, value, *, size: Sequence[int] | None = None,
                mean: Sequence[float] = (0.0, 0.0, 0.0), std: Sequence[float] = (1.0, 1.0, 1.0),
                layout: str | None = None) -> np.ndarray:
    """One image file as a 1xCxHxW (or 1xHxWxC) float32 array for the input ``value`` (an IR
    ``Value``): RGB (or gray for one channel), resized to ``size`` (height, width; default the
    input's fixed spatial size), scaled to [0, 1], then ``(x - mean) / std`` per channel."""
    import cv2

    layout = layout or _guess_layout(value.shape)
    if layout not in ("NCHW", "NHWC") or value.rank != 4:
        raise InputError(f"image input {value.name!r} of shape {value.shape}: expected a rank-4 NCHW or NHWC input")
    channels_dim = value.shape[1] if layout == "NCHW" else value.shape[3]
    spatial = value.shape[2:] if layout == "NCHW" else value.shape[1:3]
    if size is None:
        if not all(isinstance(d, int) for d in spatial):
            raise InputError(f"image input {value.name!r} has no fixed spatial size {value.shape}; "
                             "give --size HxW")
        size = tuple(spatial)
    height, width = (int(size[0]), int(size[-1]))
    channels = channels_dim if isinstance(channels_dim, int) else 3
    mean_v, std_v = _per_channel(mean, channels, "mean"), _per_channel(std, channels, "std")
    if np.any(std_v == 0):
        raise InputError(f"image normalization: std {list(std)} has a zero entry")
    image = cv2.imread(str(file), cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR)
    if image is None:
        raise InputError(f"image {file}: OpenCV cannot decode it")
    image = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    if channels == 1:
        image = image[:, :, None]
    else:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    pixels = (image.astype(np.float32) / 255.0 - mean_v) / std_v
    pixels = pixels.transpose(2, 0, 1) if layout == "NCHW" else pixels
    return pixels[None].astype(np.float32)


def random_data(graph: Graph, count: int, *, seed: int = 0) -> Iterator[Feeds]:
    """``count`` standard-normal feeds; warns, because such ranges do not describe real data."""
    warnings.warn("calibrating on random data: the int8 ranges will not match real inputs and "
                  "accuracy will suffer; pass real samples for a model you deploy",
                  RandomCalibrationWarning, stacklevel=2)
    rng = np.random.default_rng(seed)
    for _ in range(count):
        feeds = {}
        for value in graph.inputs:
            shape = tuple(d if isinstance(d, int) else 1 for d in (value.shape or ()))
            dtype = dtypes.numpy_dtype(value.dtype) if value.dtype else np.float32
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        yield feeds


def iterate_feeds(data: Any, graph: Graph) -> Iterator[Feeds]:
    """Normalize a Python source of samples into model-shaped feed dicts: an iterable of dicts,
    of arrays (one-input models) or of tuples (one array per input, in order), or one array."""
    names = graph.input_names
    if isinstance(data, np.ndarray):
        data = [data]
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes)):
        raise InputError(f"calibration data: expected an iterable of feeds, found {type(data).__name__}")
    for index, item in enumerate(data):
        where = f"calibration sample {index}"
        if isinstance(item, Mapping):
            feeds = dict(item)
        elif isinstance(item, (tuple, list)):
            if len(item) != len(names):
                raise InputError(f"{where}: a sequence of {len(item)} arrays for inputs {names}")
            feeds = dict(zip(names, item, strict=True))
        else:
            if len(names) != 1:
                raise InputError(f"{where}: one array given but the model has inputs {names}; give dicts")
            feeds = {names[0]: item}
        yield from shape_feeds(feeds, graph, where=where)


def shape_feeds(feeds: Mapping[str, Any], graph: Graph, *, where: str) -> Iterator[Feeds]:
    """Check names, add a missing batch dim, split batches larger than the model's fixed one."""
    expected = {v.name: v for v in graph.inputs}
    unknown, missing = sorted(set(feeds) - set(expected)), sorted(set(expected) - set(feeds))
    if unknown or missing:
        raise InputError(f"{where}: expected inputs {list(expected)}, found {sorted(feeds)}")
    arrays: Feeds = {}
    pieces = 1
    for name, raw in feeds.items():
        value = expected[name]
        array = np.asarray(raw)
        if value.dtype and dtypes.is_tensor_type(value.dtype):
            want = dtypes.numpy_dtype(value.dtype)
            if array.dtype != want:
                if array.dtype.kind == "f" and np.dtype(want).kind == "f":
                    array = array.astype(want)
                else:
                    raise InputError(f"{where}: input {name!r} expected dtype {value.dtype}, found {array.dtype}")
        if value.shape is not None and array.ndim == len(value.shape) - 1:
            array = array[None]
        if value.shape is not None and array.ndim != len(value.shape):
            raise InputError(f"{where}: input {name!r} expected rank {len(value.shape)} {value.shape}, "
                             f"found shape {array.shape}")
        batch = value.shape[0] if value.shape else None
        if isinstance(batch, int) and batch > 0 and array.shape[0] != batch:
            if array.shape[0] % batch:
                raise InputError(f"{where}: input {name!r} has batch {array.shape[0]}, not a multiple of the "
                                 f"model's batch {batch}")
            pieces = max(pieces, array.shape[0] // batch)
        arrays[name] = array
    if pieces == 1:
        yield arrays
        return
    for index in range(pieces):
        piece = {}
        for name, array in arrays.items():
            batch = expected[name].shape[0]
            piece[name] = array[index * batch:(index + 1) * batch] if array.shape[0] != batch else array
        yield piece


def open_source(source: Any, graph: Graph, *, size: Sequence[int] | None = None,
                mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                random_samples: int = 0, layout: str | None = None) -> Iterator[Feeds]:
    """Feeds from a folder path (.npy/.npz files, else images), one .npy, .npz or image file, a
    Python iterable, or, with ``source=None`` and ``random_samples > 0``, random data."""
    if source is None:
        if random_samples <= 0:
            raise InputError("calibration data: none given; pass samples, a folder, or explicitly ask for "
                             "random data (random_samples=N, --calib-random N)")
        return random_data(graph, random_samples)
    mean, std = mean or (0.0, 0.0, 0.0), std or (1.0, 1.0, 1.0)
    if isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        suffix = Path(source).suffix.lower()
        if suffix in (".npy", ".npz"):
            return npy_file(source, graph)
        if suffix in IMAGE_SUFFIXES and len(graph.inputs) == 1:
            pixels = image_array(source, graph.inputs[0], size=size, mean=mean, std=std, layout=layout)
            return shape_feeds({graph.inputs[0].name: pixels}, graph, where=str(source))
        raise InputError(f"calibration file {source}: expected a folder, a .npy or .npz file, or an image "
                         f"({', '.join(IMAGE_SUFFIXES)}) for a one-input model")
    if isinstance(source, (str, os.PathLike)):
        folder = _folder(source, "calibration data")
        if any(p.suffix.lower() in (".npy", ".npz") for p in folder.iterdir()):
            return npy_folder(folder, graph)
        return image_folder(folder, graph, size=size, mean=mean, std=std, layout=layout)
    return iterate_feeds(source, graph)


def sample_count(source: Any, random_samples: int = 0) -> int | None:
    """How many samples ``open_source`` yields, where known without reading them: the random
    count, one for a file, the files of a folder (an .npz holding a batch may yield more), the
    length of a sized Python source; else None."""
    if source is None:
        return random_samples or None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_file():
            return 1
        if path.is_dir():
            arrays = [p for p in path.iterdir() if p.suffix.lower() in (".npy", ".npz")]
            return len(arrays) or sum(1 for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        return None
    if isinstance(source, (np.ndarray, Mapping)):
        return 1
    return len(source) if hasattr(source, "__len__") else None


def _folder(path: str | os.PathLike, what: str) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{what} folder {folder}: expected an existing directory")
    return folder


def _guess_layout(shape: tuple | None) -> str:
    if shape is not None and len(shape) == 4 and shape[-1] in (1, 3) and shape[1] not in (1, 3):
        return "NHWC"
    return "NCHW"


def _per_channel(values: Sequence[float], channels: int, what: str) -> np.ndarray:
    array = np.asarray(list(values), dtype=np.float32).reshape(-1)
    if array.size == 1:
        return np.full(channels, array[0], np.float32)
    if array.size != channels:
        raise InputError(f"image normalization {what} {list(values)}: expected 1 or {channels} values")
    return array
