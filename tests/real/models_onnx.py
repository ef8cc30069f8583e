"""ONNX models of the corpus: files from several exporters that packages ship.

- rapidocr-onnxruntime: PP-OCRv4 text detector and recognizer, and the v2.0 direction
  classifier (paddle2onnx: dynamic dims declared as ``-1`` or with no value, unnamed nodes);
- ddddocr: a CRNN captcha recognizer with an LSTM (torch.onnx 1.9) and a YOLOX detector;
- nudenet: a YOLOv8n detector (torch.onnx 2.3, symbolic output dims);
- silero-vad: voice activity detectors with recurrent state, as ``If`` over two sample
  rates (spox, torch.onnx), fp16 inside, If-less, and a sequence variant with an LSTM;
- openwakeword 0.5.1: the wake-word pipeline's three stages (torch.onnx and tf2onnx): a
  mel-spectrogram front end over 16 kHz int16-scaled audio (dynamic length), Google's
  speech_embedding CNN over windows of 76 mel frames, and the "hey jarvis" classifier head
  (an ``If`` inside) over 16 embeddings. Each stage is fed what the stage before it gives on
  ``speech_like``, computed by onnxruntime on the package's own files, as openwakeword does;
- onnx's own shipped "light" model-zoo graphs (caffe2 exports at opset 9: LRN, grouped
  convolutions, Sum, Dropout), whose weights are constant fills (0.02). The light SqueezeNet
  is not here: its fills give logits of about 1e9 that are equal across the 1000 classes, so
  its Softmax turns one-ulp differences of accumulation order into a one-hot (OpenVINO's
  blocked convolutions do exactly that); no tolerance can judge it. The numpy tests run it
  (tests/backends/numpy/test_softmax_sigmoid_edges.py).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from .checks import RealModel, run_onnxruntime
from .corpus import image_input, model_file, photo, resize, speech_like

IMAGENET_MEAN = [123.675, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]
RAPIDOCR = "rapidocr_onnxruntime/models/"
SILERO = "silero_vad/data/"


def text_line(height: int, width: int) -> np.ndarray:
    """The first printed line of scikit-image's ``text`` photo as an RGB crop, resized to
    ``height`` x ``width`` and normalized as PP-OCR's recognizer and classifier expect
    (``(x / 255 - 0.5) / 0.5``), NCHW."""
    gray = photo("text")[10:60, :]  # the line "Two roads diverged..." (rows 10 to 60)
    rgb = np.repeat(resize(gray, height, width)[..., None], 3, axis=-1).astype(np.float32)
    return np.ascontiguousarray(((rgb / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None])


def ddddocr_line(width: int) -> np.ndarray:
    """A gray 64-high crop of printed text, ``(x / 255 - 0.5) / 0.5``, as earlier ddddocr releases fed it
    (1.6 feeds ``x / 255``; the INT8 task, ``tests/quantize/real_tasks.py``, does as 1.6 does)."""
    gray = photo("text")[10:60, :].astype(np.float32)
    image = resize(gray, 64, width)
    return np.ascontiguousarray(((image / 255.0 - 0.5) / 0.5)[None, None].astype(np.float32))


def imagenet(name: str, size: int = 224):
    return lambda: [image_input(name, size, size, mean=IMAGENET_MEAN, std=IMAGENET_STD)]


def light(name: str, photo_name: str, note: str, refuses: dict[str, str] | None = None) -> RealModel:
    """One of onnx's shipped light model-zoo graphs, fed an ImageNet-normalized photo."""

    def source():
        import onnx

        return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")

    return RealModel(id=f"onnx/light_{name}", package="onnx", format="onnx", task="classification",
                     source=source, feeds=imagenet(photo_name), note=f"caffe2 export (opset 9); {note}",
                     refuses=refuses or {})


def silero_state(path, chunk: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    """The recurrent state after one earlier chunk of speech, from onnxruntime: the checks
    then run a second chunk on a non-zero state, as streaming does."""
    state = np.zeros((2, 1, 128), np.float32)
    return run_onnxruntime(path, [chunk, state, *rest])[1]


def silero_feeds(member: str, *, sr: bool, sr_first: bool = False, samples: int = 512):
    def feeds():
        path = model_file("silero-vad", SILERO + member)
        audio = speech_like(1.0)
        first, second = audio[None, 4000:4000 + samples], audio[None, 4000 + samples:4000 + 2 * samples]
        rate = [np.array(16000, np.int64)] if sr else []
        if sr_first:  # declared order: input, sr, state
            state = run_onnxruntime(path, [first, *rate, np.zeros((2, 1, 128), np.float32)])[1]
            return [second, *rate, state]
        return [second, silero_state(path, first, *rate), *rate]
    return feeds


def sequence_feeds():
    """silero's sequence model: frames of 576 samples (64 context + 512 new), LSTM h and c."""
    audio = speech_like(1.0)
    frames = np.stack([audio[3936 + 512 * i:3936 + 512 * i + 576] for i in range(8)])
    rng = np.random.default_rng(1)
    return [frames, (0.1 * rng.standard_normal((1, 1, 128))).astype(np.float32),
            (0.1 * rng.standard_normal((1, 1, 128))).astype(np.float32)]


# ----------------------------------------------------------------------------- openwakeword

WAKEWORD = "openwakeword/resources/models/"
WAKEWORD_CHUNK = 1280 + 3 * 160  # a streaming call: 80 ms of new audio and 3 hops of context
MEL_WINDOW, MEL_STEP = 76, 8  # frames per embedding window, frames between windows
# The heads' scores on speech that holds no wake word are 1e-6 to 1e-3, which a 1e-5 floor would
# hide; 1e-7 is above what onnxruntime's Sigmoid (an approximation) differs from an exact one by.
HEAD_ATOL = 1e-7


def wakeword_file(name: str):
    return model_file("openwakeword", WAKEWORD + name)


def wakeword_audio(seconds: float = 2.0) -> np.ndarray:
    """``speech_like`` as openwakeword takes it: 16 kHz int16 sample values, float32, ``[1, n]``."""
    return np.round(speech_like(seconds) * 32767).astype(np.float32)[None]


@functools.lru_cache(maxsize=1)
def wakeword_mel_windows() -> np.ndarray:
    """``[n, 76, 32, 1]``: the package's melspectrogram.onnx on 2 s of speech, transformed
    (``x / 10 + 2``) and cut into windows as ``AudioFeatures._get_embeddings`` does."""
    mel = run_onnxruntime(wakeword_file("melspectrogram.onnx"), [wakeword_audio()])[0]
    spec = np.squeeze(mel) / 10 + 2
    windows = [spec[i:i + MEL_WINDOW] for i in range(0, spec.shape[0] - MEL_WINDOW + 1, MEL_STEP)]
    return np.stack(windows)[..., None].astype(np.float32)


@functools.lru_cache(maxsize=1)
def wakeword_embeddings() -> np.ndarray:
    """``[1, 16, 96]``: the package's embedding_model.onnx on those windows, the 16 (1.28 s)
    that a wake-word head reads."""
    embeddings = run_onnxruntime(wakeword_file("embedding_model.onnx"), [wakeword_mel_windows()])[0]
    return np.ascontiguousarray(embeddings.reshape(-1, 96)[None, :16])


def wakeword_chunk() -> list[np.ndarray]:
    return [np.ascontiguousarray(wakeword_audio()[:, 8000:8000 + WAKEWORD_CHUNK])]


def wakeword_windows() -> list[np.ndarray]:
    return [np.ascontiguousarray(wakeword_mel_windows()[4:8])]


MODELS: list[RealModel] = [
    RealModel(
        id="rapidocr/ppocrv4_det", package="rapidocr-onnxruntime", format="onnx", task="ocr-detection",
        source=lambda: model_file("rapidocr-onnxruntime", RAPIDOCR + "ch_PP-OCRv4_det_infer.onnx"),
        feeds=lambda: [image_input("page", 192, 384, mean=IMAGENET_MEAN, std=IMAGENET_STD)],
        refuses={"tflite-export": "spatial dims must be static"},
        note="paddle2onnx; dynamic dims; TFLite needs the static entry below",
    ),
    RealModel(
        id="rapidocr/ppocrv4_det_static", package="rapidocr-onnxruntime", format="onnx", task="ocr-detection",
        source=lambda: model_file("rapidocr-onnxruntime", RAPIDOCR + "ch_PP-OCRv4_det_infer.onnx"),
        feeds=lambda: [image_input("page", 192, 384, mean=IMAGENET_MEAN, std=IMAGENET_STD)],
        convert_kwargs={"input_shapes": {"x": (1, 3, 192, 384)}},
        note="converted with static input_shapes: every output shape concrete",
    ),
    RealModel(
        id="rapidocr/ppocrv4_rec", package="rapidocr-onnxruntime", format="onnx", task="ocr-recognition",
        source=lambda: model_file("rapidocr-onnxruntime", RAPIDOCR + "ch_PP-OCRv4_rec_infer.onnx"),
        feeds=lambda: [text_line(48, 320)],
        note="paddle2onnx; SVTR attention, height declared with no value",
        refuses={"tflite-export": "more than one dim unknown at export"},  # a Reshape; see _static
    ),
    RealModel(
        id="rapidocr/ppocrv4_rec_static", package="rapidocr-onnxruntime", format="onnx", task="ocr-recognition",
        source=lambda: model_file("rapidocr-onnxruntime", RAPIDOCR + "ch_PP-OCRv4_rec_infer.onnx"),
        feeds=lambda: [text_line(48, 320)],
        convert_kwargs={"input_shapes": {"x": (1, 3, 48, 320)}},
        note="static input_shapes: the shape subgraphs fold, TFLite export works",
    ),
    RealModel(
        id="rapidocr/ppocr_mobile_v2_cls", package="rapidocr-onnxruntime", format="onnx", task="classification",
        source=lambda: model_file("rapidocr-onnxruntime", RAPIDOCR + "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
        feeds=lambda: [text_line(48, 192)],
        note="paddle2onnx (opset 11); batch declared as dim_value -1",
    ),
    RealModel(
        id="ddddocr/common", package="ddddocr", format="onnx", task="ocr-recognition",
        source=lambda: model_file("ddddocr", "ddddocr/common.onnx"),
        feeds=lambda: [ddddocr_line(256)],
        note="torch.onnx 1.9; CNN + LSTM, width symbolic",
        refuses={"tflite-export": "no TFLite export rule for this op"},  # its LSTM
    ),
    RealModel(
        id="ddddocr/common_det", package="ddddocr", format="onnx", task="detection",
        source=lambda: model_file("ddddocr", "ddddocr/common_det.onnx"),
        feeds=lambda: [image_input("coffee", 416, 416, mean=0.0, std=1.0)],
        note="torch.onnx 1.9 (opset 11); YOLOX on raw 0..255 pixels",
    ),
    RealModel(
        id="nudenet/320n", package="nudenet", format="onnx", task="detection",
        source=lambda: model_file("nudenet", "nudenet/320n.onnx"),
        feeds=lambda: [image_input("astronaut", 320, 320)],
        note="torch.onnx 2.3; YOLOv8n, symbolic batch/height/width",
        refuses={"tflite-export": "spatial dims must be static"},
    ),
    RealModel(
        id="nudenet/320n_static", package="nudenet", format="onnx", task="detection",
        source=lambda: model_file("nudenet", "nudenet/320n.onnx"),
        feeds=lambda: [image_input("astronaut", 320, 320)],
        convert_kwargs={"input_shapes": {"images": (1, 3, 320, 320)}},
        note="static input_shapes: TFLite export takes the whole detector",
    ),
    RealModel(
        id="silero-vad/silero_vad", package="silero-vad", format="onnx", task="vad",
        source=lambda: model_file("silero-vad", SILERO + "silero_vad.onnx"),
        feeds=silero_feeds("silero_vad.onnx", sr=True),
        note="spox; one If over the sample rate, subgraphs with LSTM state (the tflite backend takes the Equal "
             "that picks the branch, numpy the If)",
        refuses={"tflite-export": "no TFLite export rule for this op"},
    ),
    RealModel(
        id="silero-vad/silero_vad_16k_op15", package="silero-vad", format="onnx", task="vad",
        source=lambda: model_file("silero-vad", SILERO + "silero_vad_16k_op15.onnx"),
        feeds=silero_feeds("silero_vad_16k_op15.onnx", sr=True),
        note="torch.onnx 2.3 (opset 15); If nodes",
        refuses={"tflite-export": "more than one dim unknown at export"},
    ),
    RealModel(
        id="silero-vad/silero_vad_half", package="silero-vad", format="onnx", task="vad",
        source=lambda: model_file("silero-vad", SILERO + "silero_vad_half.onnx"),
        feeds=silero_feeds("silero_vad_half.onnx", sr=False),
        note="float16 weights and compute inside, float32 interface",
        refuses={"tflite-export": "more than one dim unknown at export"},
    ),
    RealModel(
        id="silero-vad/silero_vad_op18_ifless", package="silero-vad", format="onnx", task="vad",
        source=lambda: model_file("silero-vad", SILERO + "silero_vad_op18_ifless.onnx"),
        feeds=silero_feeds("silero_vad_op18_ifless.onnx", sr=True, sr_first=True),
        note="torch.onnx 2.9 (opset 18)",
        refuses={"tflite-export": "no TFLite export rule for this op"},  # If
    ),
    RealModel(
        id="silero-vad/silero_vad_16k_sequence", package="silero-vad", format="onnx", task="vad",
        source=lambda: model_file("silero-vad", SILERO + "silero_vad_16k_sequence.onnx"),
        feeds=sequence_feeds,
        note="torch.onnx 2.11; LSTM over a sequence of frames",
        refuses={"tflite-export": "only 2-D convolutions"},  # the STFT's Conv1d
    ),
    RealModel(
        id="silero-vad/silero_vad_openvino_16k", package="silero-vad", format="onnx", task="vad",
        source=lambda: model_file("silero-vad", SILERO + "silero_vad_openvino_16k.onnx"),
        feeds=silero_feeds("silero_vad_openvino_16k.onnx", sr=False, samples=576),
        note="spox; static shapes, several nodes share one name",
        refuses={"tflite-export": "only 2-D convolutions"},
    ),
    RealModel(
        id="openwakeword/melspectrogram", package="openwakeword", format="onnx", task="audio-features",
        source=lambda: wakeword_file("melspectrogram.onnx"), feeds=wakeword_chunk,
        refuses={"tflite-export": "more than one dim unknown at export"},  # batch and length
        note="torch.onnx 1.11: STFT as Conv over the samples, power, mel MatMul, Log, clipped below its ReduceMax; "
             "batch and length dynamic; fed one streaming chunk (1760 int16-scaled samples)",
    ),
    RealModel(
        id="openwakeword/embedding_model", package="openwakeword", format="onnx", task="audio-embedding",
        source=lambda: wakeword_file("embedding_model.onnx"), feeds=wakeword_windows,
        note="tf2onnx 1.12: Google's speech_embedding CNN (LeakyRelu, Max), four windows of 76 mel frames of speech",
    ),
    RealModel(
        id="openwakeword/hey_jarvis", package="openwakeword", format="onnx", task="wake-word",
        source=lambda: wakeword_file("hey_jarvis_v0.1.onnx"), feeds=lambda: [wakeword_embeddings()],
        atol=HEAD_ATOL, refuses={"tflite-export": "no TFLite export rule for this op"},  # the If
        note="torch.onnx 1.12: dense layers with LayerNorm and an If; 16 embeddings of speech (no wake word)",
    ),
    light("shufflenet", "coffee", "grouped convolutions, channel shuffle; AveragePool excluding its pads"),
    light("resnet50", "astronaut", "Sum", refuses={"tflite-export": "no TFLite export rule for this op"}),
    light("inception_v1", "chelsea", "LRN; AveragePool excluding its pads"),
    light("densenet121", "coffee", "1746 nodes"),
]
