"""ONNX models of the corpus: files from several exporters that packages ship."""

from __future__ import annotations

from .checks import RealModel
from .corpus import image_input, model_file

MODELS: list[RealModel] = [
    RealModel(
        id="rapidocr/ppocrv4_det", package="rapidocr-onnxruntime", format="onnx", task="ocr-detection",
        source=lambda: model_file("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
        feeds=lambda: [image_input("page", 192, 384, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])],
        note="paddle2onnx; dynamic dims declared as -1",
    ),
]
