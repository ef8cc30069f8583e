"""Small PyTorch models built in code (no torchvision, random weights) for the converter
tests and ``benchmarks/bench_convert_pytorch.py``.

Each ``ZooEntry`` builds a module in eval mode and example inputs for a batch size. Channel
counts are tiny by default so the tests stay fast; ``mobilenet_v2(width=1.0)`` at 224x224 is
the real-sized network the benchmark times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


# -- convolutional nets -------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, features: int = 12, hidden: int = 24, classes: int = 5):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                    nn.Tanh(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.layers(x), dim=-1)


class LeNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.sigmoid(self.conv1(x)), 2)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18Style(nn.Module):
    """ResNet-18 layout (stem, 4 stages of 2 basic blocks) at a fraction of the width."""

    def __init__(self, width: int = 4, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], width
        for index, cout in enumerate([width, width * 2, width * 4, width * 8]):
            stride = 1 if index == 0 else 2
            stages += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                   nn.ReLU6(inplace=True), nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


def _divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class MobileNetV2Style(nn.Module):
    """The MobileNetV2 architecture; ``width=1.0`` is the 3.5M-parameter ImageNet network."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width: float = 1.0, classes: int = 1000, depth: int = 7):
        super().__init__()
        cin = _divisible(32 * width)
        last = _divisible(1280 * max(1.0, width))
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(inplace=True)]
        for expand, channels, repeats, stride in self.SETTINGS[:depth]:
            cout = _divisible(channels * width)
            for index in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if index == 0 else 1, expand))
                cin = cout
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1(x)), F.relu(self.expand3(x))], dim=1)


class SqueezeNetStyle(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(16, 4, 8), Fire(16, 4, 8), nn.MaxPool2d(3, 2, ceil_mode=True), Fire(16, 6, 12))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(24, classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


class UNetStyle(nn.Module):
    """Encoder-decoder with skip connections; three ways of upsampling."""

    def __init__(self, base: int = 4, classes: int = 2):
        super().__init__()

        def double_conv(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True))

        self.enc1, self.enc2, self.enc3 = double_conv(3, base), double_conv(base, base * 2), double_conv(base * 2, base * 4)
        self.up_transposed = nn.ConvTranspose2d(base * 4, base * 2, 2, stride=2)
        self.dec2 = double_conv(base * 4, base * 2)
        self.dec1 = double_conv(base * 2 + base, base)
        self.up_nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        e3 = self.enc3(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up_transposed(e3), e2], dim=1))
        up = F.interpolate(d2, scale_factor=2.0, mode="bilinear", align_corners=False)
        d1 = self.dec1(torch.cat([up, e1], dim=1))
        return self.head(d1) + self.up_nearest(F.avg_pool2d(self.head(d1), 2))


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(scale))))


class MBConv(nn.Module):
    """EfficientNet's block: expand 1x1, depthwise, squeeze-excitation, project, residual."""

    def __init__(self, channels: int = 8, expand: int = 4, kernel: int = 5):
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU())
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, kernel, padding=kernel // 2, groups=hidden, bias=False),
                                       nn.BatchNorm2d(hidden), nn.SiLU())
        self.se = SqueezeExcitation(hidden, max(1, channels // 4))
        self.project = nn.Sequential(nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.se(self.depthwise(self.expand(x))))


class EfficientNetStyle(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, 2, 1, bias=False), nn.BatchNorm2d(channels), nn.SiLU())
        self.blocks = nn.Sequential(MBConv(channels), MBConv(channels, kernel=3))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


# -- sequence models ------------------------------------------------------------------------------
class TransformerClassifier(nn.Module):
    """``nn.TransformerEncoder`` (MultiheadAttention, LayerNorm, GELU, dropout) over features."""

    def __init__(self, features: int = 6, model_dim: int = 16, heads: int = 2, layers: int = 2, classes: int = 3):
        super().__init__()
        self.embed = nn.Linear(features, model_dim)
        layer = nn.TransformerEncoderLayer(model_dim, heads, dim_feedforward=32, dropout=0.1, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(model_dim)
        self.head = nn.Linear(model_dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embed(x))).mean(dim=1))


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        qkv = self.qkv(x).reshape(batch, length, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = q @ k.transpose(-1, -2) / (self.head_dim ** 0.5) + additive_mask
        context = torch.softmax(scores, dim=-1) @ v
        return self.out(context.transpose(1, 2).reshape(batch, length, hidden))


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(hidden, intermediate), nn.GELU(), nn.Linear(intermediate, hidden))
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x, additive_mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class BertStyle(nn.Module):
    """Word + position + token-type embeddings, masked self-attention layers, tanh pooler."""

    def __init__(self, vocab: int = 50, hidden: int = 16, heads: int = 2, layers: int = 2, max_len: int = 32):
        super().__init__()
        self.words = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        self.token_types = nn.Embedding(2, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, hidden * 4) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.words(input_ids) + self.positions(positions) + self.token_types(torch.zeros_like(input_ids))
        x = self.embed_norm(x)
        additive_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, additive_mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


class RecurrentClassifier(nn.Module):
    def __init__(self, cell: str = "lstm", features: int = 5, hidden: int = 8, classes: int = 3):
        super().__init__()
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(features, hidden, num_layers=2, batch_first=True, bidirectional=cell == "lstm")
        self.head = nn.Linear(hidden * (2 if cell == "lstm" else 1), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sequence, _ = self.rnn(x)
        return self.head(sequence[:, -1])


# -- the zoo ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ZooEntry:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]  # batch size -> example inputs
    input_names: tuple[str, ...] = ("input",)

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        module = self.build().eval()
        _randomize_norm_statistics(module)
        return module


def _randomize_norm_statistics(module: nn.Module) -> None:
    """Fresh BatchNorm layers are the identity; random statistics make the test meaningful."""
    generator = torch.Generator().manual_seed(1)
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            with torch.no_grad():
                layer.running_mean.copy_(torch.randn(layer.num_features, generator=generator) * 0.1)
                layer.running_var.copy_(torch.rand(layer.num_features, generator=generator) + 0.5)
                layer.weight.copy_(torch.rand(layer.num_features, generator=generator) + 0.5)
                layer.bias.copy_(torch.randn(layer.num_features, generator=generator) * 0.1)


def _images(channels: int, size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda batch: (torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(batch)),)


def _sequence(length: int, features: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda batch: (torch.randn(batch, length, features, generator=torch.Generator().manual_seed(batch)),)


def _bert_inputs(batch: int, length: int = 7) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, 50, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[:, length - 2:] = 0  # padding at the end of every sequence
    return ids, mask


ZOO: dict[str, ZooEntry] = {entry.name: entry for entry in [
    ZooEntry("mlp", MLP, lambda batch: (torch.randn(batch, 12, generator=torch.Generator().manual_seed(batch)),)),
    ZooEntry("lenet", LeNet, _images(1, 28)),
    ZooEntry("resnet18_style", ResNet18Style, _images(3, 32)),
    ZooEntry("mobilenet_v2_style", lambda: MobileNetV2Style(width=0.25, classes=10, depth=4), _images(3, 32)),
    ZooEntry("squeezenet_style", SqueezeNetStyle, _images(3, 33)),
    ZooEntry("unet_style", UNetStyle, _images(3, 16)),
    ZooEntry("efficientnet_style", EfficientNetStyle, _images(3, 16)),
    ZooEntry("transformer_encoder", TransformerClassifier, _sequence(6, 6)),
    ZooEntry("bert_style", BertStyle, _bert_inputs, ("input_ids", "attention_mask")),
    ZooEntry("lstm", lambda: RecurrentClassifier("lstm"), _sequence(7, 5)),
    ZooEntry("gru", lambda: RecurrentClassifier("gru"), _sequence(7, 5)),
]}

# The real-sized network the benchmark times (not run by the tests: too slow on numpy).
MOBILENET_V2_224 = ZooEntry("mobilenet_v2_224", lambda: MobileNetV2Style(width=1.0, classes=1000), _images(3, 224))
