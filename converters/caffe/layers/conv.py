"""Convolution and Deconvolution (``ConvolutionParameter``) -> ONNX Conv / ConvTranspose.

Caffe's geometry is ONNX's with symmetric explicit pads: a convolution's output is
``floor((H + 2p - (d (k - 1) + 1)) / s) + 1`` and a deconvolution's ``s (H - 1) + d (k - 1) + 1 - 2p``.
Weights are ``(out, in / group, k...)`` for Convolution and ``(in, out / group, k...)`` for
Deconvolution, the layouts of Conv and ConvTranspose.
"""

from __future__ import annotations

from typing import Any

from edgeinfer.converters.caffe.builder import Blob, LayerContext, layer


def _per_axis(ctx: LayerContext, param: Any, name: str, default: int, spatial: int) -> list[int]:
    """A repeated conv field (``pad``/``kernel_size``/``stride``/``dilation``) for each spatial
    axis, with its ``<name>_h``/``<name>_w`` override for 2-D."""
    short = {"kernel_size": "kernel"}.get(name, name)
    h_field, w_field = f"{short}_h", f"{short}_w"
    if h_field in param.DESCRIPTOR.fields_by_name and (param.HasField(h_field) or param.HasField(w_field)):
        if spatial != 2:
            raise ctx.invalid(f"{h_field}/{w_field} apply to 2-D convolutions only, input has {spatial} spatial axes")
        if not (param.HasField(h_field) and param.HasField(w_field)):
            raise ctx.invalid(f"expected both {h_field} and {w_field}, found only one")
        if len(getattr(param, name)):
            raise ctx.invalid(f"expected either {name} or {h_field}/{w_field}, found both")
        return [getattr(param, h_field), getattr(param, w_field)]
    values = [int(v) for v in getattr(param, name)]
    if not values:
        if name == "kernel_size":
            raise ctx.invalid("expected kernel_size or kernel_h/kernel_w, found neither")
        return [default] * spatial
    if len(values) == 1:
        return values * spatial
    if len(values) != spatial:
        raise ctx.invalid(f"expected 1 or {spatial} values of {name}, found {len(values)}")
    return values


def _conv_common(ctx: LayerContext, transpose: bool) -> None:
    ctx.expect_bottoms(1)
    ctx.expect_tops(1)
    param = ctx.param("convolution_param")
    shape = ctx.shape()
    if param.axis not in (1, 1 - len(shape)):
        raise ctx.unsupported(f"convolution over axis {param.axis}; only the channel axis 1 is supported")
    spatial = len(shape) - 2
    if spatial < 1:
        raise ctx.invalid(f"expected an input of rank >= 3, found shape {list(shape)}")
    kernel = _per_axis(ctx, param, "kernel_size", 0, spatial)
    pads = _per_axis(ctx, param, "pad", 0, spatial)
    strides = _per_axis(ctx, param, "stride", 1, spatial)
    dilations = _per_axis(ctx, param, "dilation", 1, spatial)
    if not all(kernel) or not all(strides) or not all(dilations):
        raise ctx.invalid(f"expected kernel_size, stride and dilation >= 1, found kernel {list(kernel)}, "
                          f"stride {list(strides)}, dilation {list(dilations)}")
    group, channels, outputs = int(param.group), shape[1], int(param.num_output)
    if group < 1 or channels % group or outputs % group:
        raise ctx.invalid(f"group {group} must divide the input channels ({channels}) and num_output ({outputs})")
    weight_shape = (channels, outputs // group, *kernel) if transpose else (outputs, channels // group, *kernel)
    expected = [Blob(weight_shape)] + ([Blob((outputs,), 0.0)] if param.bias_term else [])
    blobs = ctx.blobs(expected)
    inputs = [ctx.inputs[0], ctx.const(blobs[0], "weight")]
    if param.bias_term:
        inputs.append(ctx.const(blobs[1], "bias"))
    attrs = {"kernel_shape": tuple(kernel), "pads": tuple(pads + pads), "strides": tuple(strides),
             "dilations": tuple(dilations), "group": group}
    ctx.node("ConvTranspose" if transpose else "Conv", inputs, attrs, top=0)


@layer("Convolution")
def convolution(ctx: LayerContext) -> None:
    _conv_common(ctx, transpose=False)


@layer("Deconvolution")
def deconvolution(ctx: LayerContext) -> None:
    _conv_common(ctx, transpose=True)
