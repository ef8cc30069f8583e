"""Pooling -> ONNX MaxPool / AveragePool / GlobalMaxPool / GlobalAveragePool.

Caffe's output size rounds up by default, ``out = ceil((H + 2p - k) / s) + 1``, minus one when
the last window would start beyond ``H + p`` (so every window starts inside the image or its
left/top padding); ``round_mode: FLOOR`` (or OpenCV's ``ceil_mode: false``) rounds down.
ONNX's ceil_mode differs at that edge, so the converter computes Caffe's size itself and
pads the end explicitly to reach it: ``end = (out - 1) s + k - H - p``.

MAX windows are clipped to the image, which padding with -inf (ONNX pads) reproduces.
AVE windows are clipped to the *padded* image ``[-p, H + p)`` and the sum is divided by the
clipped window's size: padding counts, the overhang beyond it does not. Reproduced exactly by
zero-padding ``p`` on both sides with a Pad op (those zeros are then data and count) and
average pooling with ``count_include_pad=0`` over the extra end padding (which does not).
"""

from __future__ import annotations

from collections.abc import Sequence

from edgeinfer.converters.caffe.builder import LayerContext, layer


def caffe_pooled_size(size: int, kernel: int, pad: int, stride: int, ceil: bool) -> int:
    span = size + 2 * pad - kernel
    pooled = (-(-span // stride) if ceil else span // stride) + 1
    if pad and (pooled - 1) * stride >= size + pad:
        pooled -= 1
    return pooled


def emit_caffe_pool(ctx: LayerContext, value: str, shape: Sequence[int], method: str, kernel: Sequence[int],
                    pads: Sequence[int], strides: Sequence[int], ceil: bool, top: int | None) -> str:
    """Emit Caffe-exact 2-D MAX or AVE pooling of ``value`` (NCHW) and return the result."""
    spatial = shape[2:]
    pooled = [caffe_pooled_size(n, k, p, s, ceil) for n, k, p, s in zip(spatial, kernel, pads, strides, strict=True)]
    if any(p >= k for p, k in zip(pads, kernel, strict=True)):
        raise ctx.unsupported(f"pad {list(pads)} not smaller than kernel {list(kernel)}")
    if any(o < 1 for o in pooled):
        raise ctx.invalid(f"kernel {list(kernel)} with pad {list(pads)} does not fit input {list(spatial)}")
    ends = [(o - 1) * s + k - n - p for o, s, k, n, p in zip(pooled, strides, kernel, spatial, pads, strict=True)]
    attrs = {"kernel_shape": tuple(kernel), "strides": tuple(strides)}
    if method == "MAX":
        attrs["pads"] = tuple(pads) + tuple(max(e, 0) for e in ends)
        return ctx.node("MaxPool", [value], attrs, top=top)
    if any(pads):
        zeros = [0, 0]
        value = ctx.node("Pad", [value, ctx.ints(zeros + list(pads) + zeros + list(pads), "pads")],
                         {"mode": "constant"}, suffix="pad")
    attrs["pads"] = (0,) * len(pads) + tuple(max(e - p, 0) for e, p in zip(ends, pads, strict=True))
    attrs["count_include_pad"] = 0
    return ctx.node("AveragePool", [value], attrs, top=top)


def _field(param, name: str, default: int) -> tuple[int, int]:
    """A pooling size as (h, w): ``<base>_h``/``<base>_w`` if given, else the scalar field."""
    base = "kernel" if name == "kernel_size" else name
    h, w = f"{base}_h", f"{base}_w"
    if param.HasField(h) or param.HasField(w):
        return int(getattr(param, h)), int(getattr(param, w))
    value = int(getattr(param, name)) if param.HasField(name) else default
    return value, value


@layer("Pooling")
def pooling(ctx: LayerContext) -> None:
    ctx.expect_bottoms(1)
    if len(ctx.spec.tops) != 1:
        raise ctx.unsupported("pooling with a mask top (argmax positions) is not supported")
    param = ctx.param("pooling_param")
    method = param.PoolMethod.Name(param.pool)
    if method == "STOCHASTIC":
        raise ctx.unsupported("STOCHASTIC pooling is not supported")
    shape = ctx.shape()
    if len(shape) != 4:
        raise ctx.unsupported(f"pooling of a rank-{len(shape)} input; expected NCHW")
    if param.global_pooling:
        if param.HasField("kernel_size") or param.HasField("kernel_h"):
            raise ctx.invalid("global_pooling with an explicit kernel size")
        if any(_field(param, "pad", 0)) or any(s != 1 for s in _field(param, "stride", 1)):
            raise ctx.invalid("global_pooling expects pad 0 and stride 1")
        ctx.node("GlobalMaxPool" if method == "MAX" else "GlobalAveragePool", ctx.inputs, top=0)
        return
    kernel = _field(param, "kernel_size", 0)
    if not all(kernel):
        raise ctx.invalid("expected kernel_size or kernel_h/kernel_w (or global_pooling)")
    strides = _field(param, "stride", 1)
    if not all(strides):
        raise ctx.invalid(f"expected stride >= 1, found {list(strides)}")
    ceil = param.round_mode == param.CEIL and param.ceil_mode
    emit_caffe_pool(ctx, ctx.inputs[0], shape, method, kernel, _field(param, "pad", 0), strides, ceil, top=0)
