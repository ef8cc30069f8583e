"""BatchNormalization (inference), InstanceNormalization, LayerNormalization (with its Mean and
InvStdDev outputs), GroupNormalization, LpNormalization, LRN, MeanVarianceNormalization.

Half-precision inputs compute their statistics in float32, as ``stash_type=1`` asks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgeinfer.backends.torch.registry import LoweringContext, axis_of, lowering


def _inference_only(node, graph) -> str | None:
    if node.attrs.get("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        return "training-mode BatchNormalization (batch statistics, running-mean outputs) is not lowered"
    if not node.attrs.get("spatial", 1):
        return "BatchNormalization with spatial=0 (per-element statistics) is not lowered"
    return None


@lowering("BatchNormalization", since=6, check=_inference_only)
def batch_normalization(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, is_test=1,
                        training_mode=0):
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, epsilon)


@lowering("InstanceNormalization", since=6)
def instance_normalization(x, scale, bias, *, epsilon=1e-5):
    return F.instance_norm(x, weight=scale, bias=bias, eps=epsilon)


def _stash(x):
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def layer_norm(x, scale, bias, axis: int, epsilon: float, num_outputs: int = 1):
    axis = axis_of(axis, x.dim())
    normalized = tuple(x.shape[axis:])
    if num_outputs == 1 and tuple(scale.shape) == normalized and (bias is None or tuple(bias.shape) == normalized):
        return F.layer_norm(x, normalized, scale, bias, epsilon)
    xs = _stash(x)
    dims = list(range(axis, x.dim()))
    mean = xs.mean(dim=dims, keepdim=True)
    centered = xs - mean
    inv_std = torch.rsqrt((centered * centered).mean(dim=dims, keepdim=True) + epsilon)
    y = (centered * inv_std).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return (y, mean, inv_std)[:num_outputs] if num_outputs > 1 else y


@lowering("LayerNormalization", since=17)
def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, _ctx: LoweringContext):
    return layer_norm(x, scale, bias, axis, epsilon, _ctx.num_outputs)


def _group_norm(x, scale, bias, groups, epsilon):
    return F.group_norm(_stash(x), groups, _stash(scale), _stash(bias), epsilon).to(x.dtype)


@lowering("GroupNormalization", since=18)
def group_normalization_per_group(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    channels = x.shape[1] // num_groups
    return _group_norm(x, scale.repeat_interleave(channels), bias.repeat_interleave(channels), num_groups, epsilon)


@lowering("GroupNormalization", since=21)
def group_normalization(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    return _group_norm(x, scale, bias, num_groups, epsilon)


@lowering("LpNormalization", since=1)
def lp_normalization(x, *, axis=-1, p=2):
    norm = torch.linalg.vector_norm(x, ord=p, dim=axis_of(axis, x.dim()), keepdim=True)
    # a zero vector stays zero (as in ONNX's reference) instead of becoming 0 / 0 = NaN
    return x / torch.where(norm == 0, torch.ones_like(norm), norm)


@lowering("LRN", since=1)
def lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    squares = (x * x).unsqueeze(1)
    padded = F.pad(squares, (0, 0) * (x.dim() - 2) + ((size - 1) // 2, size // 2))
    window = padded.unfold(2, size, 1).sum(-1).squeeze(1)  # [N, C, ...]: the sum over each channel window
    return x / (bias + alpha / size * window) ** beta


@lowering("MeanVarianceNormalization", since=9)
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    dims = [axis_of(a, x.dim()) for a in axes]
    xs = _stash(x)
    centered = xs - xs.mean(dim=dims, keepdim=True)
    std = torch.sqrt((centered * centered).mean(dim=dims, keepdim=True))
    return (centered / (std + 1e-9)).to(x.dtype)  # the spec's function body adds 1e-9 to the deviation
