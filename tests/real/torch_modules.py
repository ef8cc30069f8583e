"""Module code for the corpus' PyTorch state dicts, written here so that the project depends on
neither the packages' own code (facenet-pytorch imports torchvision) nor transformers.

- ``PNet``, ``RNet``, ``ONet``: MTCNN's three stages with the layer names and shapes of
  ``facenet_pytorch/models/mtcnn.py`` (facenet-pytorch 2.6.0), so that its ``data/*.pt`` state
  dicts load with ``strict=True``.
- ``MiniLM``: a BERT encoder (embeddings, post-LayerNorm layers with masked self-attention,
  exact-erf GELU) with sentence-transformers' mean pooling and L2 normalization, the
  all-MiniLM-L6-v2 pipeline (``modules.json``: Transformer, Pooling(mean), Normalize); its
  ``model.safetensors`` loads with ``strict=True``.
- ``VoiceEncoder``: Resemblyzer's speaker encoder (``resemblyzer/voice_encoder.py``, resemblyzer
  0.1.4): a 3-layer LSTM over 40-channel mel frames, the last layer's final hidden state through
  Linear, ReLU and L2 normalization; ``pretrained.pt``'s ``model_state`` loads with ``strict=True``.
- ``WordPiece``: BERT's uncased basic tokenizer plus greedy longest-match WordPiece over the
  vocabulary of ``tokenizer.json`` (enough for plain ASCII sentences).

State dicts are read with ``torch.load(..., weights_only=True)`` (never a pickle executed) and
safetensors with the ``safetensors`` package.
"""

from __future__ import annotations

import json
import math
import unicodedata
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class PNet(nn.Module):
    """MTCNN proposal net: any input size -> (box regression, face probability) maps."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x):
        x = self.prelu1(self.conv1(x))
        x = self.pool1(x)
        x = self.prelu2(self.conv2(x))
        x = self.prelu3(self.conv3(x))
        return self.conv4_2(x), self.softmax4_1(self.conv4_1(x))


class RNet(nn.Module):
    """MTCNN refinement net: 24x24 crops -> (box regression, face probability)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 28, kernel_size=3)
        self.prelu1 = nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(28, 48, kernel_size=3)
        self.prelu2 = nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(48, 64, kernel_size=2)
        self.prelu3 = nn.PReLU(64)
        self.dense4 = nn.Linear(576, 128)
        self.prelu4 = nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.softmax5_1 = nn.Softmax(dim=1)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x))
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu4(self.dense4(x.view(x.shape[0], -1)))
        return self.dense5_2(x), self.softmax5_1(self.dense5_1(x))


class ONet(nn.Module):
    """MTCNN output net: 48x48 crops -> (box regression, 5 landmarks, face probability)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.prelu1 = nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.prelu2 = nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.prelu3 = nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4 = nn.Conv2d(64, 128, kernel_size=2)
        self.prelu4 = nn.PReLU(128)
        self.dense5 = nn.Linear(1152, 256)
        self.prelu5 = nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.softmax6_1 = nn.Softmax(dim=1)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu5(self.dense5(x.view(x.shape[0], -1)))
        return self.dense6_2(x), self.dense6_3(x), self.softmax6_1(self.dense6_1(x))


def load_state_dict(module: nn.Module, path: str | Path) -> nn.Module:
    """``module`` with the tensors of a ``torch.save``d state dict, loaded strictly."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    module.load_state_dict(state, strict=True)
    return module.eval()


# ----------------------------------------------------------------------------- Resemblyzer


class VoiceEncoder(nn.Module):
    """Resemblyzer's speaker encoder: mel frames ``[batch, frames, 40]`` -> a 256-d embedding,
    non-negative and of unit L2 norm."""

    def __init__(self, mel_channels: int = 40, hidden: int = 256, embedding: int = 256, layers: int = 3):
        super().__init__()
        self.lstm = nn.LSTM(mel_channels, hidden, layers, batch_first=True)
        self.linear = nn.Linear(hidden, embedding)
        self.relu = nn.ReLU()
        # the GE2E loss's scale and bias: trained, saved, unused at inference (the package loads
        # with strict=False to skip them; declared here so that loading is strict)
        self.similarity_weight = nn.Parameter(torch.tensor([10.0]))
        self.similarity_bias = nn.Parameter(torch.tensor([-5.0]))

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        embeds_raw = self.relu(self.linear(hidden[-1]))
        return embeds_raw / torch.norm(embeds_raw, dim=1, keepdim=True)


def load_voice_encoder(path: str | Path) -> VoiceEncoder:
    """The encoder with ``model_state`` of a Resemblyzer checkpoint (read with ``weights_only``)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    module = VoiceEncoder()
    module.load_state_dict(checkpoint["model_state"], strict=True)
    return module.eval()


# ----------------------------------------------------------------------------- BERT (MiniLM)


class _Embeddings(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden = config["hidden_size"]
        self.word_embeddings = nn.Embedding(config["vocab_size"], hidden, padding_idx=config.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(config["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(config["type_vocab_size"], hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config["layer_norm_eps"])
        self.register_buffer("position_ids", torch.arange(config["max_position_embeddings"])[None])

    def forward(self, input_ids, token_type_ids):
        positions = self.position_ids[:, :input_ids.shape[1]]
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) \
            + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class _SelfAttention(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def forward(self, x, mask_bias):
        batch, length, hidden = x.shape
        size = hidden // self.heads

        def heads(t):
            return t.view(batch, length, self.heads, size).transpose(1, 2)

        scores = heads(self.query(x)) @ heads(self.key(x)).transpose(-1, -2) / math.sqrt(size)
        weights = torch.softmax(scores + mask_bias, dim=-1)
        return (weights @ heads(self.value(x))).transpose(1, 2).reshape(batch, length, hidden)


class _DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)`` (BERT's ``*Output`` blocks)."""

    def __init__(self, inner: int, hidden: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(inner, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.self = _SelfAttention(config)
        self.output = _DenseNorm(config["hidden_size"], config["hidden_size"], config["layer_norm_eps"])

    def forward(self, x, mask_bias):
        return self.output(self.self(x, mask_bias), x)


class _Intermediate(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.dense = nn.Linear(config["hidden_size"], config["intermediate_size"])

    def forward(self, x):
        return F.gelu(self.dense(x))


class _Layer(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.attention = _Attention(config)
        self.intermediate = _Intermediate(config)
        self.output = _DenseNorm(config["intermediate_size"], config["hidden_size"], config["layer_norm_eps"])

    def forward(self, x, mask_bias):
        x = self.attention(x, mask_bias)
        return self.output(self.intermediate(x), x)


class _Encoder(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.layer = nn.ModuleList(_Layer(config) for _ in range(config["num_hidden_layers"]))

    def forward(self, x, mask_bias):
        for layer in self.layer:
            x = layer(x, mask_bias)
        return x


class _Pooler(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.dense = nn.Linear(config["hidden_size"], config["hidden_size"])


class MiniLM(nn.Module):
    """(input_ids, attention_mask) int64 [batch, length] -> (token embeddings, sentence
    embedding): sentence-transformers' all-MiniLM-L6-v2 (BERT, mean pooling over the unmasked
    tokens, L2 normalization). The BERT pooler's weights are in the file and loaded, but the
    sentence-transformers pipeline does not use them."""

    def __init__(self, config: dict):
        super().__init__()
        if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"MiniLM module: expected gelu and absolute positions, config has {config}")
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)
        self.pooler = _Pooler(config)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.to(torch.float32)
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        tokens = self.encoder(self.embeddings(input_ids, torch.zeros_like(input_ids)), bias)
        summed = (tokens * mask[..., None]).sum(1)
        pooled = summed / mask.sum(1, keepdim=True).clamp(min=1e-9)
        return tokens, F.normalize(pooled, p=2.0, dim=1)


def load_minilm(folder: str | Path) -> MiniLM:
    """MiniLM from a sentence-transformers folder (``config.json``, ``model.safetensors``)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    model = MiniLM(json.loads((folder / "config.json").read_text()))
    model.load_state_dict(load_file(folder / "model.safetensors"), strict=True)
    return model.eval()


class WordPiece:
    """BERT uncased tokenization with the vocabulary of a ``tokenizer.json``: clean, lower
    case, strip accents, split on whitespace and punctuation, then greedy longest-match
    WordPiece with ``##`` continuations; ``[CLS] ... [SEP]``."""

    def __init__(self, tokenizer_json: str | Path):
        spec = json.loads(Path(tokenizer_json).read_text())
        model = spec["model"]
        if model.get("type") != "WordPiece" or not spec["normalizer"].get("lowercase"):
            raise ValueError(f"{tokenizer_json}: expected an uncased WordPiece tokenizer")
        self.vocab: dict[str, int] = model["vocab"]
        self.unk = model["unk_token"]
        self.prefix = model["continuing_subword_prefix"]

    @staticmethod
    def _words(text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        words, current = [], ""
        for char in text:
            if char.isspace():
                words, current = words + [current] if current else words, ""
            elif unicodedata.category(char).startswith("P") or (char.isascii() and not char.isalnum()):
                words += ([current] if current else []) + [char]
                current = ""
            else:
                current += char
        return words + ([current] if current else [])

    def _pieces(self, word: str) -> list[str]:
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return [self.unk]
            pieces.append(piece)
            start = end
        return pieces

    def encode(self, text: str) -> list[int]:
        tokens = ["[CLS]", *(p for w in self._words(text) for p in self._pieces(w)), "[SEP]"]
        return [self.vocab[t] for t in tokens]
