"""Reference architectures built in code (onnx.helper + numpy), for tests, benchmarks and demos.

Every builder returns an ``onnx.ModelProto`` (opset 17) with random but realistic weights and
takes a ``seed``; the same seed gives byte-identical models.

Realistic means the activations of a standard-normal input keep a unit-ish scale all the way
through, as in a trained network, instead of exploding or vanishing:

- conv weights are He/Kaiming-normal (std ``sqrt(2 / fan_in)``), linear layers LeCun/Xavier;
- the builder tracks the per-channel distribution of every activation, no data needed: a
  conv output channel is Gaussian with mean ``sum(W) . mean_in`` and variance
  ``sum(W**2) . var_in`` (independent inputs); after ReLU, Clip, MaxPool or a residual Add it
  is carried as a few hundred draws per channel. Each BatchNormalization gets the running mean
  and variance of its input, with a little noise, i.e. what training would have stored;
  gamma ~ N(1, 0.1), beta ~ N(0, 0.1);
- the last BatchNormalization of a residual branch has a smaller gamma (trained ResNets end
  their branches with small gammas; zero-init of that gamma is a common training recipe), so
  the residual stream grows slowly with depth.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that introduced opset 17
BN_EPSILON = 1e-5
RESIDUAL_GAMMA = 0.5  # scale of the last BN gamma in a residual branch
SAMPLES = 256  # draws per channel that represent a non-Gaussian activation
_SQRT2 = math.sqrt(2.0)


class _Activation:
    """The distribution of an activation, per channel (channel axis 1): a conv output is a sum
    of many independent terms, so Gaussian (mean, variance); after a non-linearity it is kept
    as ``SAMPLES`` draws per channel, which ReLU, Clip, MaxPool and Add transform exactly."""

    __slots__ = ("mean", "var", "draws")

    def __init__(self, mean: np.ndarray, var: np.ndarray, draws: np.ndarray | None = None):
        self.mean, self.var, self.draws = mean, np.maximum(var, 1e-12), draws

    @classmethod
    def of(cls, draws: np.ndarray) -> _Activation:
        return cls(draws.mean(axis=1), draws.var(axis=1), draws)

    @property
    def channels(self) -> int:
        return self.mean.size

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """[channels, SAMPLES] draws (fresh, independent ones for a Gaussian)."""
        if self.draws is not None:
            return self.draws
        return self.mean[:, None] + np.sqrt(self.var)[:, None] * rng.standard_normal((self.channels, SAMPLES))


class _Builder:
    """Collects nodes and initializers of one model and tracks activation moments."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.stats_rng = np.random.default_rng([seed, 1])  # kept apart: weights depend on seed only
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.stats: dict[str, _Activation] = {}

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str, *, output: str | None = None, **attrs) -> str:
        """Add a node named ``name`` whose one output is ``output`` (default: ``name``)."""
        output = output or name
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        return output

    def standard_input(self, name: str, channels: int) -> str:
        self.stats[name] = _Activation(np.zeros(channels), np.ones(channels))
        return name

    # -- convolutional blocks -------------------------------------------------------------------
    def conv(self, x: str, out_channels: int, kernel: int, name: str, *, stride: int = 1,
             group: int = 1) -> str:
        """A bias-free conv (a BatchNormalization follows) with He-normal weights."""
        stats = self.stats[x]
        in_channels = stats.channels
        fan_in = in_channels // group * kernel * kernel
        weight = self.rng.normal(0.0, math.sqrt(2.0 / fan_in),
                                 (out_channels, in_channels // group, kernel, kernel)).astype(np.float32)
        pad = kernel // 2
        out = self.op("Conv", [x, self.const(f"{name}.weight", weight)], name,
                      kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=group)
        per_group_w = weight.astype(np.float64).reshape(group, out_channels // group, in_channels // group, -1)
        mean_in = stats.mean.reshape(group, 1, -1)
        var_in = stats.var.reshape(group, 1, -1)
        self.stats[out] = _Activation((per_group_w.sum(-1) * mean_in).sum(-1).reshape(-1),
                                     ((per_group_w**2).sum(-1) * var_in).sum(-1).reshape(-1))
        return out

    def batchnorm(self, x: str, name: str, *, gamma_scale: float = 1.0) -> str:
        stats = self.stats[x]
        channels = stats.channels
        sigma = np.sqrt(stats.var)
        gamma = gamma_scale * np.abs(self.rng.normal(1.0, 0.1, channels))
        beta = self.rng.normal(0.0, 0.1, channels)
        running_mean = stats.mean + 0.05 * sigma * self.rng.standard_normal(channels)
        running_var = stats.var * self.rng.uniform(0.9, 1.1, channels)
        params = [self.const(f"{name}.{field}", value.astype(np.float32)) for field, value in
                  (("scale", gamma), ("bias", beta), ("mean", running_mean), ("var", running_var))]
        out = self.op("BatchNormalization", [x, *params], name, epsilon=BN_EPSILON)
        inv_std = gamma / np.sqrt(running_var + BN_EPSILON)
        if stats.draws is None:
            self.stats[out] = _Activation(beta + inv_std * (stats.mean - running_mean), inv_std**2 * stats.var)
        else:
            self.stats[out] = _Activation.of(beta[:, None] + inv_std[:, None] * (stats.draws - running_mean[:, None]))
        return out

    def relu(self, x: str, name: str) -> str:
        out = self.op("Relu", [x], name)
        self.stats[out] = _Activation.of(np.maximum(self.stats[x].sample(self.stats_rng), 0.0))
        return out

    def relu6(self, x: str, name: str) -> str:
        bounds = [self.const(f"{name}.min", np.array(0.0, np.float32)),
                  self.const(f"{name}.max", np.array(6.0, np.float32))]
        out = self.op("Clip", [x, *bounds], name)
        self.stats[out] = _Activation.of(np.clip(self.stats[x].sample(self.stats_rng), 0.0, 6.0))
        return out

    def conv_bn(self, x: str, out_channels: int, kernel: int, name: str, *, stride: int = 1, group: int = 1,
                act: str | None = "relu", gamma_scale: float = 1.0) -> str:
        """Conv -> BatchNormalization -> optional activation (``"relu"``, ``"relu6"`` or None)."""
        y = self.conv(x, out_channels, kernel, f"{name}.conv", stride=stride, group=group)
        y = self.batchnorm(y, f"{name}.bn", gamma_scale=gamma_scale)
        if act == "relu":
            return self.relu(y, f"{name}.relu")
        if act == "relu6":
            return self.relu6(y, f"{name}.relu6")
        return y

    def add(self, a: str, b: str, name: str) -> str:
        out = self.op("Add", [a, b], name)
        first, second = self.stats[a], self.stats[b]
        if first.draws is None and second.draws is None:
            self.stats[out] = _Activation(first.mean + second.mean, first.var + second.var)
        else:
            self.stats[out] = _Activation.of(first.sample(self.stats_rng) + second.sample(self.stats_rng))
        return out

    def maxpool(self, x: str, kernel: int, stride: int, name: str, *, pad: int = 0) -> str:
        out = self.op("MaxPool", [x], name, kernel_shape=[kernel, kernel], strides=[stride, stride],
                      pads=[pad] * 4)
        draws = self.stats[x].sample(self.stats_rng)
        windows = self.stats_rng.permuted(np.tile(np.arange(SAMPLES), (kernel * kernel, 1)), axis=1)
        self.stats[out] = _Activation.of(draws[:, windows].max(axis=1))  # max of k*k independent draws
        return out

    def concat(self, parts: list[str], name: str) -> str:
        """Concatenation along channels."""
        out = self.op("Concat", parts, name, axis=1)
        self.stats[out] = _Activation.of(np.concatenate([self.stats[p].sample(self.stats_rng) for p in parts]))
        return out

    def classifier(self, x: str, classes: int, name: str, *, output: str) -> str:
        """GlobalAveragePool -> Flatten -> Gemm (LeCun-normal weights, small bias)."""
        pooled = self.op("GlobalAveragePool", [x], f"{name}.pool")
        flat = self.op("Flatten", [pooled], f"{name}.flatten", axis=1)
        features = self.stats[x].channels
        return self.linear(flat, features, classes, f"{name}.fc", output=output)

    def linear(self, x: str, in_features: int, out_features: int, name: str, *, gain: float = 1.0,
               output: str | None = None) -> str:
        """Gemm with normal weights of variance ``gain / fan_in`` (2: He, for ReLU layers)."""
        weight = self.rng.normal(0.0, math.sqrt(gain / in_features), (out_features, in_features))
        bias = self.rng.normal(0.0, 0.02, out_features)
        return self.op("Gemm", [x, self.const(f"{name}.weight", weight.astype(np.float32)),
                                self.const(f"{name}.bias", bias.astype(np.float32))], name,
                       output=output, transB=1)

    # -- the model ----------------------------------------------------------------------------
    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
              doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="devkit.zoo", ir_version=IR_VERSION)
        onnx.checker.check_model(model)
        return model


def _image_input(name: str, batch: int | str, channels: int, size: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, channels, size, size])


def _logits(name: str, batch: int | str, classes: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, classes])


# -- small models --------------------------------------------------------------------------------
def cnn_residual_depthwise(*, batch: int = 1, size: int = 32, channels: int = 16, classes: int = 10,
                           seed: int = 0) -> onnx.ModelProto:
    """A small CNN with the common building blocks: conv+BN+ReLU stem, a residual block,
    a depthwise 3x3 (group=C) + pointwise pair with ReLU6 (Clip), MaxPool, GlobalAveragePool,
    Flatten and Gemm. Input ``input`` [batch, 3, size, size], output ``logits``."""
    b = _Builder("cnn_residual_depthwise", seed)
    x = b.standard_input("input", 3)
    x = b.conv_bn(x, channels, 3, "stem")
    branch = b.conv_bn(x, channels, 3, "res.0")
    branch = b.conv_bn(branch, channels, 3, "res.1", act=None, gamma_scale=RESIDUAL_GAMMA)
    x = b.relu(b.add(x, branch, "res.add"), "res.relu")
    x = b.conv_bn(x, channels, 3, "dw", stride=2, group=channels, act="relu6")
    x = b.conv_bn(x, 2 * channels, 1, "pw", act="relu6")
    x = b.maxpool(x, 2, 2, "pool")
    b.classifier(x, classes, "head", output="logits")
    return b.model([_image_input("input", batch, 3, size)], [_logits("logits", batch, classes)],
                   cnn_residual_depthwise.__doc__ or "")


def mlp_symbolic_batch(*, features: tuple[int, ...] = (32, 64, 64, 10), seed: int = 0) -> onnx.ModelProto:
    """An MLP (Gemm+ReLU layers, Softmax head) whose batch dim is the symbol ``"N"``.
    Input ``x`` [N, features[0]], output ``probs`` [N, features[-1]]."""
    b = _Builder("mlp_symbolic_batch", seed)
    x = "x"
    layers = list(zip(features[:-1], features[1:], strict=True))
    for index, (fan_in, fan_out) in enumerate(layers):
        last = index == len(layers) - 1
        x = b.linear(x, fan_in, fan_out, f"fc{index}", gain=1.0 if last else 2.0)
        if not last:
            x = b.op("Relu", [x], f"relu{index}")
    b.op("Softmax", [x], "softmax", output="probs", axis=-1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features[0]])]
    outputs = [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", features[-1]])]
    return b.model(inputs, outputs, mlp_symbolic_batch.__doc__ or "")


def transformer_encoder_block(seq: int = 16, d: int = 64, heads: int = 4, *, batch: int = 1,
                              ffn_mult: int = 4, seed: int = 0) -> onnx.ModelProto:
    """One pre-LN transformer encoder block: LayerNormalization -> multi-head self-attention
    (MatMul+Add projections, Reshape/Transpose to heads, scaled QK^T, Softmax, Transpose back)
    -> residual Add -> LayerNormalization -> MatMul+Add, GELU (the Erf form
    ``0.5 x (1 + erf(x / sqrt 2))``), MatMul+Add -> residual Add.
    Input ``x`` [batch, seq, d], output ``y`` [batch, seq, d]."""
    if d % heads:
        raise ValueError(f"transformer_encoder_block: d={d} must be a multiple of heads={heads}")
    head_dim = d // heads
    b = _Builder("transformer_encoder_block", seed)

    def dense(x: str, fan_in: int, fan_out: int, name: str) -> str:
        weight = b.rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), (fan_in, fan_out)).astype(np.float32)
        bias = b.rng.normal(0.0, 0.02, fan_out).astype(np.float32)
        y = b.op("MatMul", [x, b.const(f"{name}.weight", weight)], f"{name}.matmul")
        return b.op("Add", [y, b.const(f"{name}.bias", bias)], name)

    def layernorm(x: str, name: str) -> str:
        scale = b.rng.normal(1.0, 0.05, d).astype(np.float32)
        bias = b.rng.normal(0.0, 0.02, d).astype(np.float32)
        return b.op("LayerNormalization", [x, b.const(f"{name}.scale", scale), b.const(f"{name}.bias", bias)],
                    name, axis=-1, epsilon=1e-5)

    def scalar(name: str, value: float) -> str:
        return b.const(name, np.array(value, np.float32))

    heads_shape = b.const("attn.heads_shape", np.array([batch, seq, heads, head_dim], np.int64))
    model_shape = b.const("attn.model_shape", np.array([batch, seq, d], np.int64))

    def to_heads(x: str, name: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [x, heads_shape], f"{name}.reshape")], name, perm=perm)

    h = layernorm("x", "ln1")
    q = to_heads(dense(h, d, d, "attn.q"), "attn.q_heads", [0, 2, 1, 3])
    k = to_heads(dense(h, d, d, "attn.k"), "attn.k_heads", [0, 2, 3, 1])  # K^T directly
    v = to_heads(dense(h, d, d, "attn.v"), "attn.v_heads", [0, 2, 1, 3])
    scores = b.op("MatMul", [q, k], "attn.scores")
    scores = b.op("Mul", [scores, scalar("attn.scale", 1.0 / math.sqrt(head_dim))], "attn.scaled")
    weights = b.op("Softmax", [scores], "attn.softmax", axis=-1)
    context = b.op("MatMul", [weights, v], "attn.context")
    context = b.op("Transpose", [context], "attn.merge", perm=[0, 2, 1, 3])
    context = b.op("Reshape", [context, model_shape], "attn.merge_reshape")
    x = b.op("Add", ["x", dense(context, d, d, "attn.out")], "res1")

    h = dense(layernorm(x, "ln2"), d, ffn_mult * d, "ffn.up")
    erf = b.op("Erf", [b.op("Mul", [h, scalar("gelu.inv_sqrt2", 1.0 / _SQRT2)], "gelu.scale")], "gelu.erf")
    gate = b.op("Mul", [b.op("Add", [erf, scalar("gelu.one", 1.0)], "gelu.add"), scalar("gelu.half", 0.5)],
                "gelu.half_mul")
    h = b.op("Mul", [h, gate], "gelu")
    b.op("Add", [x, dense(h, ffn_mult * d, d, "ffn.down")], "res2", output="y")
    shape = [batch, seq, d]
    return b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                   transformer_encoder_block.__doc__ or "")


# -- ImageNet classics ---------------------------------------------------------------------------
def resnet50(batch: int = 1, size: int = 224, *, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 (v1.5: stride on the 3x3 conv), bottleneck blocks 3-4-6-3, 25.6M parameters.
    Input ``input`` [batch, 3, size, size], output ``logits`` [batch, classes]."""
    b = _Builder("resnet50", seed)
    x = b.standard_input("input", 3)
    x = b.conv_bn(x, 64, 7, "stem", stride=2)
    x = b.maxpool(x, 3, 2, "stem.pool", pad=1)
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True), start=1):
        for index in range(blocks):
            stride = 2 if index == 0 and stage > 1 else 1
            name = f"layer{stage}.{index}"
            y = b.conv_bn(x, width, 1, f"{name}.1")
            y = b.conv_bn(y, width, 3, f"{name}.2", stride=stride)
            y = b.conv_bn(y, 4 * width, 1, f"{name}.3", act=None, gamma_scale=RESIDUAL_GAMMA)
            if index == 0:
                x = b.conv_bn(x, 4 * width, 1, f"{name}.downsample", stride=stride, act=None)
            x = b.relu(b.add(x, y, f"{name}.add"), f"{name}.relu")
    b.classifier(x, classes, "head", output="logits")
    return b.model([_image_input("input", batch, 3, size)], [_logits("logits", batch, classes)],
                   resnet50.__doc__ or "")


def _make_divisible(value: float, divisor: int = 8) -> int:
    """MobileNet's channel rounding: to a multiple of ``divisor``, never 10% below ``value``."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                         (6, 160, 3, 2), (6, 320, 1, 1))  # expansion t, channels c, repeats n, stride s


def mobilenet_v2(size: int = 224, *, batch: int = 1, width_mult: float = 1.0, classes: int = 1000,
                 seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2: inverted residual blocks (1x1 expand + ReLU6, depthwise 3x3 + ReLU6, linear
    1x1 projection; residual Add when shapes allow), 3.5M parameters at width 1.0.
    Input ``input`` [batch, 3, size, size], output ``logits`` [batch, classes]."""
    b = _Builder("mobilenet_v2", seed)
    x = b.standard_input("input", 3)
    channels = _make_divisible(32 * width_mult)
    x = b.conv_bn(x, channels, 3, "stem", stride=2, act="relu6")
    block = 0
    for expansion, out_base, repeats, first_stride in MOBILENET_V2_SETTINGS:
        out_channels = _make_divisible(out_base * width_mult)
        for repeat in range(repeats):
            stride = first_stride if repeat == 0 else 1
            name = f"block{block}"
            hidden = channels * expansion
            y = b.conv_bn(x, hidden, 1, f"{name}.expand", act="relu6") if expansion != 1 else x
            y = b.conv_bn(y, hidden, 3, f"{name}.dw", stride=stride, group=hidden, act="relu6")
            residual = stride == 1 and channels == out_channels
            y = b.conv_bn(y, out_channels, 1, f"{name}.project", act=None,
                          gamma_scale=RESIDUAL_GAMMA if residual else 1.0)
            x = b.add(x, y, f"{name}.add") if residual else y
            channels = out_channels
            block += 1
    x = b.conv_bn(x, _make_divisible(1280 * max(1.0, width_mult)), 1, "last", act="relu6")
    b.classifier(x, classes, "head", output="logits")
    return b.model([_image_input("input", batch, 3, size)], [_logits("logits", batch, classes)],
                   mobilenet_v2.__doc__ or "")


def inception_net(size: int = 64, *, batch: int = 1, blocks: int = 3, width: int = 32, classes: int = 100,
                  seed: int = 0) -> onnx.ModelProto:
    """An Inception-v1-style net: a conv stem, then ``blocks`` inception blocks of four
    independent branches (1x1; 1x1 -> 3x3; 1x1 -> 5x5; 3x3 max-pool -> 1x1) joined by a channel
    Concat, with a stride-2 max-pool after every block but the last; GAP classifier.
    Input ``input`` [batch, 3, size, size], output ``logits`` [batch, classes]."""
    b = _Builder("inception_net", seed)
    x = b.standard_input("input", 3)
    x = b.conv_bn(x, width, 3, "stem", stride=2)
    for index in range(blocks):
        name = f"block{index}"
        c = width * (index + 1)
        one = b.conv_bn(x, c, 1, f"{name}.b1")
        three = b.conv_bn(b.conv_bn(x, c // 2, 1, f"{name}.b3.reduce"), c, 3, f"{name}.b3")
        five = b.conv_bn(b.conv_bn(x, c // 4, 1, f"{name}.b5.reduce"), c // 2, 5, f"{name}.b5")
        pooled = b.conv_bn(b.maxpool(x, 3, 1, f"{name}.pool", pad=1), c // 2, 1, f"{name}.pool.proj")
        x = b.concat([one, three, five, pooled], f"{name}.concat")
        if index < blocks - 1:
            x = b.maxpool(x, 2, 2, f"{name}.down")
    b.classifier(x, classes, "head", output="logits")
    return b.model([_image_input("input", batch, 3, size)], [_logits("logits", batch, classes)],
                   inception_net.__doc__ or "")


BUILDERS = {
    "cnn_residual_depthwise": cnn_residual_depthwise,
    "transformer_encoder_block": transformer_encoder_block,
    "mlp_symbolic_batch": mlp_symbolic_batch,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "inception_net": inception_net,
}


def example_inputs(model: onnx.ModelProto, *, seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    """Standard-normal float32 feeds for a zoo model (symbolic dims bound to ``batch``)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in info.type.tensor_type.shape.dim]
        feeds[info.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


__all__ = [
    "BUILDERS",
    "cnn_residual_depthwise",
    "example_inputs",
    "inception_net",
    "mlp_symbolic_batch",
    "mobilenet_v2",
    "resnet50",
    "transformer_encoder_block",
]
