"""TFLite models of the corpus: MediaPipe-style files (float, fp16 weights, sparse)."""

from __future__ import annotations

from .checks import RealModel
from .corpus import image_input, model_file

MODELS: list[RealModel] = [
    RealModel(
        id="mediapipe/face_detection_short_range", package="mediapipe", format="tflite", task="face-detection",
        source=lambda: model_file("mediapipe", "mediapipe/modules/face_detection/face_detection_short_range.tflite"),
        feeds=lambda: [image_input("astronaut", 128, 128, mean=127.5, std=127.5, layout="NHWC")],
        note="fp16 weights behind DEQUANTIZE",
    ),
]
