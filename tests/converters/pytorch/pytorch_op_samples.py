"""Small modules that together exercise every op in the PyTorch converter's registry.

Each sample groups related ops so one export covers many of them; ``test_ops.py`` converts
each sample both as captured (pre-dispatch ops such as ``aten.linear``) and decomposed to
core ATen (``aten.addmm``), compares with PyTorch eager, and checks that the union of ops the
samples produce covers the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Elementwise(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        positive = x.abs() + 0.5
        a = (x + y) * (x - y) / positive + torch.pow(positive, 1.5) + positive ** 2
        b = torch.sqrt(positive) + torch.rsqrt(positive) + torch.reciprocal(positive) + torch.exp(-positive)
        c = torch.log(positive) - torch.neg(x) + torch.sin(x) * torch.cos(y) + torch.erf(x)
        d = torch.floor(x * 3) + torch.ceil(y * 3) + torch.round(x * 2) + torch.sign(y)
        e = torch.clamp(x, -0.5, 0.7) + torch.clip(y, min=0.1) + torch.maximum(x, y) - torch.minimum(x, y)
        e = e + torch.clamp_min(x, 0.2) + torch.clamp_max(y, -0.1)  # (mean pooling divides by
        # mask.sum().clamp(min=eps))
        f = 1.0 - x  # rsub
        g = torch.div(x * 10, 3, rounding_mode="floor") + torch.div(y * 10, 3, rounding_mode="trunc")
        h = x.clone()
        h.add_(1.0).mul_(2.0).sub_(0.5).div_(1.5)
        return a, b, c, d, e, f, g, h


class Logic(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gt, lt = x > y, x < 0.2
        both = torch.logical_and(gt, torch.logical_not(lt)) | (x >= 1.0) | (y <= -1.0)
        either = torch.logical_or(x == y, x != 0.5) & ~(y > 2.0)
        picked = torch.where(both, x, y) + torch.masked_fill(x, lt, -3.0)
        return picked, either.to(torch.float32), both.any(dim=1), either.all(dim=0)


class Activations(nn.Module):
    def __init__(self):
        super().__init__()
        self.prelu = nn.PReLU(4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = F.relu(x) + F.relu6(x) + F.hardtanh(x, -0.5, 0.5) + F.leaky_relu(x, 0.1) + F.elu(x) + F.selu(x)
        b = F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x) + torch.sigmoid(x) + torch.tanh(x)
        c = F.hardsigmoid(x) + F.hardswish(x) + F.softplus(x) + F.mish(x) + self.prelu(x)
        d = F.softmax(x, dim=1) + F.log_softmax(x, dim=-1)
        inplace = [x.clone() for _ in range(10)]
        F.relu_(inplace[0])
        torch.sigmoid_(inplace[1])
        F.hardtanh(inplace[2], inplace=True)
        F.elu(inplace[3], inplace=True)
        F.leaky_relu(inplace[4], inplace=True)
        F.selu(inplace[5], inplace=True)
        F.silu(inplace[6], inplace=True)
        F.hardsigmoid(inplace[7], inplace=True)
        F.hardswish(inplace[8], inplace=True)
        inplace[9].tanh_().clamp_(-0.5, 0.5)
        return a, b, c, d, torch.stack(inplace)


class Shapes(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [2, 3, 4, 5]
        a = x.reshape(2, 12, 5).view(2, 3, 20).flatten(1).unflatten(1, (6, 10))
        b = x.permute(0, 2, 3, 1).transpose(1, 2).contiguous()
        c = x[:, :1].squeeze(1).unsqueeze(0).expand(3, 2, 4, 5)
        d = torch.cat([x, x * 2], dim=1).repeat(1, 1, 2, 1)
        e = torch.stack([x[:, 0], x[:, 1]], dim=-1)
        first, second = torch.split(x, [1, 2], dim=1)
        halves = torch.chunk(x, 2, dim=3)
        rows = torch.unbind(x, dim=2)
        f = first * second.sum(dim=1, keepdim=True) + halves[0].mean() + rows[-1].unsqueeze(2)
        g = x[:, 1, 1:3, ::2] + x.narrow(3, 1, 3)[:, 0, :2, :2].mean()
        h = torch.index_select(x, 2, torch.tensor([3, 0, 1])) + torch.flip(x, dims=[3])[:, :, :3]
        i = F.pad(x, (1, 2, 0, 1), value=0.5)
        j = torch.gather(x, 3, torch.tensor([[[[4, 0]]]]).expand(2, 3, 4, 2))
        k = x.t() if x.dim() == 2 else x[0, 0].t()
        m = x.expand_as(x) + x.type_as(x) + x.detach()
        n = torch.concat(torch.split(x, 2, dim=3), dim=3) + torch.concatenate([x], dim=0)
        p = x[:, torch.tensor([0, 2])] + x[:, :, torch.tensor([1, 3])].sum()
        q = x[0, 0].tril() + x[0, 0].triu(1)
        return a, b, c, d, e, f, g, h, i, j, k, m, n, p, q


class Constants(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [2, 6]
        a = x + torch.zeros(2, 6) + torch.ones_like(x) + torch.full((1, 6), 0.25) + torch.zeros_like(x)
        b = x * torch.arange(6, dtype=torch.float32) + torch.arange(1, 13, 2).to(torch.float32)
        c = x.new_zeros(2, 6) + x.new_ones(2, 6) + torch.full_like(x, 2.0) + torch.ones(1)
        d = (x > 0).to(torch.int64).to(torch.float32) + x.to(torch.float64).to(torch.float32)
        filled = torch.empty(2, 6)
        filled.fill_(0.5)
        return a, b, c, d, filled * x


class Reductions(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [3, 4, 5]
        a = x.sum(dim=1) + x.mean(dim=(1,)) + x.amax(dim=1) - x.amin(dim=1)
        values, indices = x.max(dim=2)
        low, _ = x.min(dim=2)
        b = values - low + indices.to(torch.float32) + x.argmax(dim=1).to(torch.float32)[:, :4].sum()
        c = x.argmin(dim=2).to(torch.float32) + x.max() - x.min()
        d = x.prod(dim=2) + x.var(dim=2) + x.std(dim=2, unbiased=False) + torch.linalg.vector_norm(x, dim=2)
        e = torch.cumsum(x, dim=1) + torch.logsumexp(x, dim=1, keepdim=True)
        top_values, top_indices = torch.topk(x, 2, dim=2)
        variance, mean = torch.var_mean(x, dim=1)
        return a, b, c, d, e, top_values, top_indices, variance + mean, x.sum()


class ConvPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(3, 4, 3, padding=1)
        self.conv2d = nn.Conv2d(3, 8, 3, stride=2, padding=1, dilation=1, groups=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.conv3d = nn.Conv3d(2, 2, 3, padding=1)
        self.deconv3d = nn.ConvTranspose3d(2, 1, 2, stride=2)
        self.deconv1d = nn.ConvTranspose1d(4, 2, 3, stride=2)
        self.deconv2d = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [2, 3, 8, 8]
        seq = x.flatten(2)
        a = F.max_pool1d(self.deconv1d(self.conv1d(seq)), 2) + F.avg_pool1d(self.deconv1d(self.conv1d(seq)), 2)
        image = self.grouped(self.conv2d(x))
        b = F.max_pool2d(image, 2, ceil_mode=True) + F.avg_pool2d(image, 3, 2, 1, count_include_pad=False)
        c = self.deconv2d(image) + F.adaptive_avg_pool2d(image, 1).mean()
        d = self.shuffle(image)
        volume = self.conv3d(x[:, :2].unsqueeze(2).expand(2, 2, 4, 8, 8))
        e = F.max_pool3d(volume, 2) + F.avg_pool3d(volume, 2) + self.deconv3d(volume)[:, :, ::4, ::4, ::4]
        f = F.adaptive_avg_pool1d(seq, 4) + F.adaptive_avg_pool2d(x, (2, 2)).flatten(2)
        return a, b, c, d, e, f


class Resize(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [1, 2, 4, 6]
        a = F.interpolate(x, scale_factor=2, mode="nearest")
        b = F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True)
        c = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        d = F.interpolate(x, scale_factor=2.0, mode="bicubic", align_corners=False)
        e = F.interpolate(x[:, :, 0], scale_factor=2.0, mode="linear") + F.interpolate(x[:, :, 0], scale_factor=2.0)
        volume = x.unsqueeze(2).expand(1, 2, 2, 4, 6)
        f = F.interpolate(volume, scale_factor=2.0, mode="nearest") + F.interpolate(volume, scale_factor=2.0,
                                                                                   mode="trilinear")
        return a, b, c, d, e, f


class Normalization(nn.Module):
    def __init__(self):
        super().__init__()
        self.batch = nn.BatchNorm1d(4)
        self.layer = nn.LayerNorm([6])
        self.group = nn.GroupNorm(2, 4)
        self.instance = nn.InstanceNorm1d(4, affine=True)
        self.dropouts = nn.Sequential(nn.Dropout(0.3), nn.Dropout1d(0.3), nn.AlphaDropout(0.3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [2, 4, 6]
        return self.batch(x), self.layer(x), self.group(x), self.instance(x), self.dropouts(x)


class LinearAlgebra(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 3)
        self.weight = nn.Parameter(_rand(5, 4, seed=3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [2, 3, 5], y: [2, 5, 4]
        a = self.linear(x) + self.linear(x[0])[None]
        b = torch.matmul(x, y) + torch.bmm(x, y) + torch.mm(x[0], self.weight)
        c = torch.baddbmm(torch.ones(2, 3, 4), x, y, alpha=0.5, beta=2.0)
        d = torch.einsum("bij,bjk->bik", x, y) + torch.addmm(torch.ones(4), x[1], self.weight)
        return a, b, c, d


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.embedding = nn.Embedding(10, 8)

    def forward(self, tokens: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # tokens [2, 5], x [2, 5, 8]
        h = x + self.embedding(tokens)
        padding = (torch.arange(5) >= 4).expand(2, 5)  # the last position is padding
        a, _ = self.attention(h, h, h, key_padding_mask=padding, need_weights=False)
        q = h.reshape(2, 5, 2, 4).transpose(1, 2)
        b = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        mask = torch.ones(5, 5).tril() > 0
        c = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        return a, b, c


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(4, 5, num_layers=2)
        self.rnn = nn.RNN(4, 3, nonlinearity="tanh", batch_first=True)
        self.relu_rnn = nn.RNN(4, 3, nonlinearity="relu", bidirectional=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # x: [2, 7, 4]
        a, (h, c) = self.lstm(x)
        b, hidden = self.gru(x.transpose(0, 1))
        d, _ = self.rnn(x)
        e, _ = self.relu_rnn(x.transpose(0, 1))
        return a, h, c, b, hidden, d, e


def _symbolic_flatten(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0] * x.shape[1] // 2, -1)


class SymbolicSizes(nn.Module):
    """Python arithmetic on sizes (traced with a symbolic batch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, 4, 3]
        batch = x.shape[0]
        flat = _symbolic_flatten(x)
        padded = torch.cat([flat.reshape(batch, -1), x.new_zeros(batch + 1, 12)[1:]], dim=1)
        return padded * (batch % 3) + (batch // 2) - (batch - 1) * (batch + 1)


class Combined(nn.Module):
    """Several samples in one module (one export covers all): inputs and outputs concatenated."""

    def __init__(self, *parts: tuple[type[nn.Module], int]):
        super().__init__()
        self.parts = nn.ModuleList(part() for part, _ in parts)
        self.arity = [arity for _, arity in parts]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs, start = [], 0
        for part, arity in zip(self.parts, self.arity):
            result = part(*inputs[start:start + arity])
            outputs.extend(result if isinstance(result, tuple) else (result,))
            start += arity
        return tuple(outputs)


@dataclass(frozen=True)
class Sample:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    dynamic_batch: bool = False

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        module = self.build().eval()
        for layer in module.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                layer.running_mean.uniform_(-0.5, 0.5)
                layer.running_var.uniform_(0.5, 1.5)
        return module


SAMPLES: dict[str, Sample] = {s.name: s for s in [
    Sample("pointwise", lambda: Combined((Elementwise, 2), (Logic, 2), (Activations, 1), (Constants, 1)),
           lambda: (_rand(3, 4), _rand(3, 4, seed=1), _rand(3, 4, seed=2), _rand(3, 4, seed=3),
                    _rand(2, 4, 5, seed=4), _rand(2, 6, seed=5))),
    Sample("tensors", lambda: Combined((Shapes, 1), (Reductions, 1)),
           lambda: (_rand(2, 3, 4, 5), _rand(3, 4, 5, seed=1))),
    Sample("vision", lambda: Combined((ConvPool, 1), (Resize, 1), (Normalization, 1)),
           lambda: (_rand(2, 3, 8, 8), _rand(1, 2, 4, 6, seed=1), _rand(2, 4, 6, seed=2))),
    Sample("dense", lambda: Combined((LinearAlgebra, 2), (Attention, 2)),
           lambda: (_rand(2, 3, 5), _rand(2, 5, 4, seed=1),
                    torch.randint(0, 10, (2, 5), generator=torch.Generator().manual_seed(0)), _rand(2, 5, 8, seed=2))),
    Sample("recurrent", Recurrent, lambda: (_rand(2, 7, 4),)),
    Sample("symbolic_sizes", SymbolicSizes, lambda: (_rand(4, 4, 3),), dynamic_batch=True),
]}
