"""Which inputs and outputs of each op are quantized, and how: the quantizer rules.

A rule ``fn(node, plan) -> bool`` is registered per op with ``@quantizer(op_type)`` (keyed by
``(domain, op_type, since)`` like every registry) and asks the ``QuantPlan`` for what it
needs; it returns whether the node was quantized. Rules first check that everything they
need is quantizable, then commit, so a node is either fully quantized or left in float.

The layout mirrors what onnxruntime's int8 kernels expect from a QDQ graph, so that
onnxruntime fuses ``DQ -> op -> Q`` into its integer kernels (QLinearConv, QGemm,
QLinearMatMul, QLinearAdd, QLinearGlobalAveragePool, ...):

- weighted ops (Conv, ConvTranspose, Gemm, MatMul with a constant weight): the activation
  input and the output get Q/DQ pairs; the weight is stored as int8, symmetric, per output
  channel (Conv axis 0, ConvTranspose axis 1, Gemm axis 0 with transB else 1, MatMul axis 1)
  behind a DequantizeLinear; the bias is stored as int32 with scale ``x_scale * w_scale[c]``
  and zero point 0.
- element-wise and pooling ops with their own output range (Add, Mul, Concat,
  GlobalAveragePool, Sigmoid, ...): every float input and the output get Q/DQ pairs.
- data-movement ops (MaxPool, Reshape, Flatten, Transpose, ...): quantized only when their
  input already is; the output reuses the input's scale and zero point, so the engine runs
  them directly on 8-bit data.
- Relu and Clip right after a quantized op are removed with asymmetric activations: the op's
  output takes the activation's (non-negative) range and the saturation of QuantizeLinear
  performs the clamp. Otherwise they reuse their input's parameters (exact for a clamp at 0).

- Concat whose inputs' ranges differ by more than ``CONCAT_RANGE_RATIO`` stays float: one
  scale over boxes in pixels (0-320) and class probabilities (0-1) rounds every probability to
  0. Its inputs keep the parameters their producers gave them (each its own scale).
- A quantized Concat's inputs that only it reads take its output's parameters
  (``QuantPlan.share_concat_inputs``): rounded once, to the grid the Concat's output rounds
  them to anyway, instead of twice, never clipped to their own narrower range, and the Concat
  is a plain copy of 8-bit data (TFLite's rule for it). On YOLOv8n (its per-scale Concats of
  box and class logits) the class scores' SQNR moved by +0.1 dB (minmax) and -0.25 dB (mse)
  on 12 held-out views: the Concat's output grid decides there.

The op that writes a graph output (directly, or through data movement only: the Transpose
back to NHWC after a converted TFLite model's last Conv) keeps a float output unless
``quantize_outputs`` is asked for: its inputs are quantized, the result it writes is not
(logits, boxes and probabilities keep their precision; the engines have kernels with a float
output).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edgeinfer.registry import OpRegistry

if TYPE_CHECKING:
    from edgeinfer.ir import Node
    from edgeinfer.quantize.qdq import QuantPlan

QuantizerRule = Callable[["Node", "QuantPlan"], bool]
QUANTIZERS: OpRegistry[QuantizerRule] = OpRegistry("quantizer")
SAME_AS_INPUT = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Resize",
                 "AveragePool", "Gather", "Split", "Pad", "Relu", "Clip")
OWN_RANGE = ("Add", "Mul", "Concat", "GlobalAveragePool", "Sigmoid", "LeakyRelu", "Softmax")
CONCAT_RANGE_RATIO = 16.0  # largest input magnitude over the smallest: above it, Concat stays float


def quantizer(op_type: str | tuple[str, ...], *, since: int = 1, domain: str = "") -> Callable[[QuantizerRule], QuantizerRule]:
    """Register a quantizer rule for ``(domain, op_type)`` valid from opset ``since``."""
    return QUANTIZERS.decorator(op_type, domain=domain, since=since)


def _weighted(node: Node, plan: QuantPlan, weight_axis: int, *, bias_index: int | None = 2) -> bool:
    x = node.inputs[0]
    weight = node.inputs[1]
    bias = node.inputs[bias_index] if bias_index is not None and len(node.inputs) > bias_index else ""
    if not plan.can_quantize_activation(x) or not plan.can_quantize_weight(weight, weight_axis):
        return False
    plan.activation(x)
    plan.weight(node, 1, weight_axis)
    if bias and plan.can_quantize_bias(bias, weight, weight_axis):
        plan.bias(node, bias_index, x, weight)
    plan.output(node, 0)
    return True


@quantizer("Conv", since=1)
def conv(node: Node, plan: QuantPlan) -> bool:
    return _weighted(node, plan, 0)


@quantizer("ConvTranspose", since=1)
def conv_transpose(node: Node, plan: QuantPlan) -> bool:
    if int(node.attrs.get("group", 1)) != 1:
        return False  # per-channel axis 1 of a grouped weight covers only C_out / group channels
    return _weighted(node, plan, 1)


@quantizer("Gemm", since=1)
def gemm(node: Node, plan: QuantPlan) -> bool:
    axis = 0 if int(node.attrs.get("transB", 0)) else 1
    bias_index = 2 if float(node.attrs.get("alpha", 1.0)) == 1.0 else None
    return _weighted(node, plan, axis, bias_index=bias_index)


@quantizer("MatMul", since=1)
def matmul(node: Node, plan: QuantPlan) -> bool:
    a, b = node.inputs[0], node.inputs[1]
    if plan.is_constant(b):
        return _weighted(node, plan, 1, bias_index=None)
    if not (plan.can_quantize_activation(a) and plan.can_quantize_activation(b)):
        return False
    plan.activation(a)
    plan.activation(b)
    plan.output(node, 0)
    return True


@quantizer(OWN_RANGE, since=1)
def own_range(node: Node, plan: QuantPlan) -> bool:
    inputs = [i for i in node.inputs if i]
    if not inputs or not all(plan.can_quantize_activation(i) for i in inputs):
        return False
    if not plan.has_range(node.outputs[0]):
        return False
    if node.op_type == "Concat" and plan.range_ratio(inputs) > CONCAT_RANGE_RATIO:
        return False
    for name in inputs:
        plan.activation(name)
    plan.output(node, 0)
    if node.op_type == "Concat":
        plan.share_concat_inputs(node)
    return True


@quantizer(SAME_AS_INPUT, since=1)
def same_as_input(node: Node, plan: QuantPlan) -> bool:
    source = node.inputs[0]
    if not plan.is_quantized(source):
        return False
    if node.op_type == "MaxPool" and plan.opset < 12:
        return False  # 8-bit MaxPool exists from opset 12
    if node.op_type == "Pad" and not plan.pads_with_zero(node):
        return False
    for out in node.outputs:
        if out:
            plan.same_as(out, source)
    return True
