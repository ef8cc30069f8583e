"""The registry of PyTorch ops edgeinfer converts, and the check that refuses the rest.

Every ``call_function`` node of a captured ``ExportedProgram`` must resolve to an entry here
before anything is translated; the translation itself (aten -> ONNX) is PyTorch's own
exporter (``torch.onnx`` with onnxscript's torchlib). An entry therefore records that an op
is supported *by edgeinfer end to end* (exported, imported, run by the numpy backend and
compared with PyTorch eager in ``tests/converters/pytorch``), which ONNX ops it becomes, and
optionally a rule that refuses variants the pipeline cannot run faithfully (a BatchNorm
captured in training mode, complex tensors).

Keys are ``(namespace, op)`` as torch names them: ``("aten", "conv2d")`` covers every overload
of ``aten::conv2d``; python operators on symbolic sizes live in the ``python`` namespace.
Both the pre-dispatch ops that ``torch.export.export`` records (``aten.linear``) and the core
ATen ops of a decomposed program (``aten.addmm``) are registered, because ``.pt2`` files come
in both forms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from edgeinfer.errors import UnsupportedOpError
from edgeinfer.registry import OpRegistry

Check = Callable[[Any], "str | None"]  # torch.fx.Node -> reason it cannot be converted, or None


@dataclass(frozen=True)
class TorchOp:
    namespace: str
    name: str
    category: str
    onnx: tuple[str, ...]  # ONNX ops the exporter lowers it to ("" = none: removed or folded)
    note: str = ""
    check: Check | None = None

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.name}"


TORCH_OPS: OpRegistry[TorchOp] = OpRegistry("PyTorch op rule")


def supported(names: str | Iterable[str], *, category: str, onnx: Iterable[str] = (), note: str = "",
              namespace: str = "aten", check: Check | None = None) -> None:
    """Register ops that share a category, an ONNX lowering and (optionally) a check."""
    for name in [names] if isinstance(names, str) else names:
        TORCH_OPS.register(name, TorchOp(namespace, name, category, tuple(onnx), note, check), domain=namespace)


def _arg(node: Any, index: int, keyword: str, default: Any = None) -> Any:
    if keyword in node.kwargs:
        return node.kwargs[keyword]
    return node.args[index] if len(node.args) > index else default


def _eval_only(index: int, keyword: str) -> Check:
    def check(node: Any) -> str | None:
        if _arg(node, index, keyword, False) is True:
            return (f"runs in training mode ({keyword}=True); call model.eval() before exporting, "
                    "edgeinfer converts inference graphs")
        return None

    return check


def _input_statistics_only(node: Any) -> str | None:
    if _arg(node, 5, "use_input_stats", True) is False:
        return ("normalizes with running statistics (track_running_stats=True in eval mode), which ONNX "
                "InstanceNormalization cannot express")
    return None


def _input_statistics_or_eval(node: Any) -> str | None:
    if getattr(node.target, "_overloadname", "") == "no_stats":  # instance norm: input statistics
        return None
    return _eval_only(5, "training")(node)


# -- elementwise --------------------------------------------------------------------------------
supported(["add", "add_"], category="elementwise", onnx=["Add"])
supported(["sub", "sub_", "rsub"], category="elementwise", onnx=["Sub"])
supported(["mul", "mul_"], category="elementwise", onnx=["Mul"])
supported(["div", "div_"], category="elementwise", onnx=["Div", "Floor", "Cast"],
          note="rounding_mode 'floor'/'trunc' included")
supported("pow", category="elementwise", onnx=["Pow", "Mul"])
supported("sqrt", category="elementwise", onnx=["Sqrt"])
supported("rsqrt", category="elementwise", onnx=["Sqrt", "Reciprocal"])
supported("reciprocal", category="elementwise", onnx=["Reciprocal"])
supported("exp", category="elementwise", onnx=["Exp"])
supported(["log", "log1p"], category="elementwise", onnx=["Log", "Add"])
supported("abs", category="elementwise", onnx=["Abs"])
supported("neg", category="elementwise", onnx=["Neg"])
supported("sin", category="elementwise", onnx=["Sin"])
supported("cos", category="elementwise", onnx=["Cos"])
supported("erf", category="elementwise", onnx=["Erf"])
supported("floor", category="elementwise", onnx=["Floor"])
supported("ceil", category="elementwise", onnx=["Ceil"])
supported("round", category="elementwise", onnx=["Round"])
supported("sign", category="elementwise", onnx=["Sign"])
supported(["clamp", "clamp_", "clip", "clamp_min", "clamp_max"], category="elementwise", onnx=["Clip", "Max", "Min"])
supported(["maximum", "minimum"], category="elementwise", onnx=["Max", "Min"])
supported("where", category="elementwise", onnx=["Where"])
supported(["masked_fill", "masked_fill_"], category="elementwise", onnx=["Where"])
supported(["eq", "ne", "gt", "ge", "lt", "le"], category="comparison",
          onnx=["Equal", "Not", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"])
supported(["logical_not", "logical_and", "logical_or", "bitwise_not", "bitwise_and", "bitwise_or", "__and__",
           "__or__"], category="comparison", onnx=["Not", "And", "Or"], note="bitwise ops on bool tensors")

# -- activations ----------------------------------------------------------------------------------
supported(["relu", "relu_"], category="activation", onnx=["Relu"])
supported(["hardtanh", "hardtanh_", "relu6"], category="activation", onnx=["Clip"])
supported(["leaky_relu", "leaky_relu_"], category="activation", onnx=["LeakyRelu"])
supported(["elu", "elu_"], category="activation", onnx=["Elu"])
supported(["selu", "selu_"], category="activation", onnx=["Selu"])
supported("gelu", category="activation", onnx=["Gelu"], note="approximate 'none' and 'tanh'")
supported(["silu", "silu_"], category="activation", onnx=["Sigmoid", "Mul"])
supported(["sigmoid", "sigmoid_"], category="activation", onnx=["Sigmoid"])
supported(["tanh", "tanh_"], category="activation", onnx=["Tanh"])
supported(["hardsigmoid", "hardsigmoid_"], category="activation", onnx=["HardSigmoid"])
supported(["hardswish", "hardswish_"], category="activation", onnx=["HardSwish"])
supported("softplus", category="activation", onnx=["Softplus", "Mul", "Div", "Greater", "Where"])
supported("mish", category="activation", onnx=["Mish"])
supported(["prelu"], category="activation", onnx=["PRelu"])
supported(["softmax", "_softmax"], category="activation", onnx=["Softmax"])
supported(["log_softmax", "_log_softmax"], category="activation", onnx=["LogSoftmax"])

# -- shapes, copies and constants --------------------------------------------------------------------
supported(["reshape", "view", "flatten", "unflatten"], category="shape", onnx=["Reshape"])
supported(["permute", "transpose", "t"], category="shape", onnx=["Transpose"])
supported("squeeze", category="shape", onnx=["Squeeze"])
supported("unsqueeze", category="shape", onnx=["Unsqueeze"])
supported(["expand", "expand_as"], category="shape", onnx=["Expand"])
supported("repeat", category="shape", onnx=["Tile", "Expand"])
supported(["cat", "concat", "concatenate"], category="shape", onnx=["Concat"])
supported("stack", category="shape", onnx=["Concat", "Unsqueeze"])
supported(["split", "split_with_sizes", "chunk", "unbind"], category="shape",
          onnx=["Split", "Slice", "Squeeze"])
supported(["select", "slice", "narrow"], category="shape", onnx=["Gather", "Slice"])
supported(["index_select", "index"], category="shape", onnx=["Gather", "GatherND"],
          note="indexing with integer tensors")
supported(["tril", "triu"], category="shape", onnx=["Trilu"])
supported("gather", category="shape", onnx=["GatherElements"])
supported("flip", category="shape", onnx=["Slice"])
supported(["constant_pad_nd", "pad"], category="shape", onnx=["Pad"], note="constant padding")
supported("pixel_shuffle", category="shape", onnx=["DepthToSpace"])
supported(["contiguous", "clone", "detach", "detach_", "alias", "lift_fresh_copy"], category="copy", onnx=["Identity"],
          note="removed by the exporter")
supported("fill_", category="copy", onnx=["Expand"], note="filling a tensor created in forward()")
supported(["to", "_to_copy", "type_as"], category="copy", onnx=["Cast"], note="real dtypes only")
supported(["zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
           "empty", "scalar_tensor"], category="constant", onnx=["ConstantOfShape", "Expand"])
supported("arange", category="constant", onnx=["Range"])
supported("sym_size", category="shape", onnx=["Shape", "Gather"], note="symbolic sizes")

# -- reductions -------------------------------------------------------------------------------------
supported("sum", category="reduction", onnx=["ReduceSum"])
supported("mean", category="reduction", onnx=["ReduceMean"])
supported(["amax", "amin"], category="reduction", onnx=["ReduceMax", "ReduceMin"])
supported(["max", "min"], category="reduction", onnx=["ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "Max", "Min"])
supported(["argmax", "argmin"], category="reduction", onnx=["ArgMax", "ArgMin"])
supported("prod", category="reduction", onnx=["ReduceProd"])
supported(["var", "std", "var_mean"], category="reduction", onnx=["ReduceMean", "Sub", "Mul", "Sqrt"])
supported("linalg_vector_norm", category="reduction", onnx=["ReduceL2", "ReduceL1", "Abs", "Pow"])
supported("cumsum", category="reduction", onnx=["CumSum"])
supported(["any", "all"], category="reduction", onnx=["ReduceMax", "ReduceMin", "Cast"])
supported("logsumexp", category="reduction", onnx=["ReduceLogSumExp"])
supported("topk", category="reduction", onnx=["TopK"])

# -- convolution and pooling -----------------------------------------------------------------------
supported(["conv1d", "conv2d", "conv3d", "convolution"], category="convolution",
          onnx=["Conv", "ConvTranspose"])
supported(["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"], category="convolution",
          onnx=["ConvTranspose"])
supported(["max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices"],
          category="pooling",
          onnx=["MaxPool"], note="indices output unsupported (max_unpool)")
supported(["avg_pool1d", "avg_pool2d", "avg_pool3d"], category="pooling", onnx=["AveragePool", "Pad"])
supported(["adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d"], category="pooling",
          onnx=["GlobalAveragePool", "ReduceMean", "AveragePool"])
supported(["upsample_nearest1d", "upsample_nearest2d", "upsample_bilinear2d", "upsample_bicubic2d",
           "upsample_linear1d", "upsample_nearest3d", "upsample_trilinear3d"], category="resize",
          onnx=["Resize"], note="interpolate / nn.Upsample: nearest, (bi/tri)linear, bicubic")

# -- normalization -----------------------------------------------------------------------------------
supported(["batch_norm", "_native_batch_norm_legit_no_training"], category="normalization",
          onnx=["BatchNormalization"], check=_eval_only(5, "training"),
          note="inference statistics; often folded into the preceding Conv by the exporter")
supported("_native_batch_norm_legit", category="normalization", onnx=["InstanceNormalization", "BatchNormalization"],
          check=_input_statistics_or_eval, note="core ATen form of InstanceNorm (no_stats)")
supported(["layer_norm", "native_layer_norm"], category="normalization", onnx=["LayerNormalization"])
supported(["group_norm", "native_group_norm"], category="normalization", onnx=["GroupNormalization"])
supported("instance_norm", category="normalization", onnx=["InstanceNormalization"],
          check=_input_statistics_only, note="track_running_stats=False (input statistics) only")

# -- linear algebra and attention ------------------------------------------------------------------------
supported(["linear", "addmm"], category="linear algebra", onnx=["Gemm", "MatMul", "Add"])
supported(["matmul", "mm", "bmm"], category="linear algebra", onnx=["MatMul"])
supported("baddbmm", category="linear algebra", onnx=["MatMul", "Add", "Mul"])
supported("einsum", category="linear algebra", onnx=["Einsum"])
supported("scaled_dot_product_attention", category="attention",
          onnx=["MatMul", "Softmax", "Mul", "Add", "Transpose", "Where"],
          note="nn.MultiheadAttention, F.scaled_dot_product_attention (masks, causal)")
supported("embedding", category="embedding", onnx=["Gather"])

# -- recurrent layers -----------------------------------------------------------------------------------
supported(["lstm"], category="recurrent", onnx=["LSTM"], note="nn.LSTM: layers, bidirectional, batch_first")
supported(["gru"], category="recurrent", onnx=["GRU"], note="nn.GRU: layers, bidirectional, batch_first")
supported(["rnn_tanh", "rnn_relu"], category="recurrent", onnx=["RNN"], note="nn.RNN")

# -- bookkeeping that the exporter removes ---------------------------------------------------------------
supported(["dropout", "feature_dropout", "alpha_dropout"], category="bookkeeping",
          onnx=["Identity"], check=_eval_only(2, "train"), note="identity in eval mode")
supported("_assert_tensor_metadata", category="bookkeeping", note="dtype assertion, removed")
supported(["getitem", "add", "sub", "mul", "floordiv", "mod"], category="bookkeeping", namespace="python",
          onnx=["Mul", "Add", "Sub", "Div", "Mod"], note="tuple indexing and symbolic size arithmetic")


# -- lookup and check ---------------------------------------------------------------------------------------
def op_key(target: Any) -> tuple[str, str]:
    """``(namespace, op)`` of an fx ``call_function`` target."""
    namespace = getattr(target, "namespace", None)
    packet = getattr(target, "overloadpacket", None)
    if namespace and packet is not None:
        return namespace, packet.__name__
    if namespace and hasattr(target, "name"):  # a higher-order operator (cond, while_loop, ...)
        return namespace, target.name() if callable(target.name) else str(target.name)
    module = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", repr(target))
    if module in ("_operator", "operator", "builtins", "math"):
        return "python", name
    return module.split(".")[0] or "python", name


def lookup(target: Any) -> TorchOp | None:
    namespace, name = op_key(target)
    return TORCH_OPS.lookup(name, domain=namespace)


def module_path(node: Any) -> str:
    """Where an fx node came from: ``'features.3.conv' (torch.nn.Conv2d)`` or the top module."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "the top-level module"
    path, kind = list(stack.values())[-1]
    kind = kind if isinstance(kind, str) else getattr(kind, "__qualname__", str(kind))
    return f"module {path or '<root>'!r} ({kind})"


def _source_line(node: Any) -> str:
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [line.strip() for line in trace if line.strip().startswith("File ")]
    return f", at {frames[-1]}" if frames else ""


def _dtype_reason(node: Any) -> str | None:
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else [value]
    for item in values:
        dtype = getattr(item, "dtype", None)
        if dtype is not None and getattr(dtype, "is_complex", False):
            return f"produces a complex tensor ({dtype}); edgeinfer has no complex dtypes"
    return None


def unsupported_nodes(graph_module: Any) -> list[tuple[Any, str]]:
    """``(fx node, reason)`` for every node edgeinfer cannot convert (subgraphs included)."""
    found = []
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            entry = lookup(node.target)
            if entry is None:
                found.append((node, "is not supported"))
                continue
            reason = (entry.check(node) if entry.check else None) or _dtype_reason(node)
            if reason:
                found.append((node, reason))
    return found


def check_supported(graph_module: Any, where: str) -> None:
    """Raise ``UnsupportedOpError`` naming the first unsupported op and where it came from."""
    problems = unsupported_nodes(graph_module)
    if not problems:
        return
    node, reason = problems[0]
    namespace, name = op_key(node.target)
    message = (f"{where}: PyTorch op {namespace}::{name} (target {node.target}, node {node.name!r}) in "
               f"{module_path(node)}{_source_line(node)} {reason}")
    others = sorted({"::".join(op_key(n.target)) for n, _ in problems[1:]} - {f"{namespace}::{name}"})
    if others:
        message += f"; also unsupported: {', '.join(others)}"
    if reason == "is not supported":
        message += " (supported ops: docs/pytorch_ops.md)"
    raise UnsupportedOpError(message)


# -- documentation -----------------------------------------------------------------------------------------
DOC_HEADER = """\
# PyTorch front end: supported inputs and ops

Generated from the registry in `converters/pytorch/ops.py` by
`python -m edgeinfer.converters.pytorch.ops > docs/pytorch_ops.md`; a test keeps it in sync.

## Inputs

| Input | How | Notes |
|---|---|---|
| `torch.nn.Module` | `ei.convert(module, example_inputs=(x,), input_names=[...], dynamic_batch=True)` | captured with `torch.export.export` (non-strict), in eval mode |
| `torch.export.ExportedProgram` | `ei.convert(exported_program)` | training-IR or core-ATen (decomposed) programs |
| `.pt2` file | `torch.export.save(ep, "model.pt2")`, then `edgeinfer convert model.pt2 -o model.eim` | archives holding pickled objects or compiled (AOTInductor) code are refused |
| TorchScript `.pt`/`.pth`/`.jit` | `torch.jit.save(torch.jit.script(m) or torch.jit.trace(m, x), "model.pt")` | needs `--input-shape name:1x3x224x224` (`input_shapes=`); converted with `TS2EPConverter`, or where that fails (`prim::If`/`prim::Loop` it cannot rewrite) with the TorchScript ONNX exporter, which keeps them as ONNX `If`/`Loop` (logged; `model.metadata["source_route"]`); a `forward` that assigns module attributes (state kept between calls) is refused |
| plain pickle / state dict | refused, never unpickled | the message says how to save a TorchScript or ExportedProgram |

`--dynamic-batch` (`dynamic_batch=True`) makes dim 0 of every input the symbol `N`.

## Ops

An op outside this table raises `UnsupportedOpError` naming the op and the module it came from.
The translation to ONNX is PyTorch's exporter (`torch.onnx`, onnxscript torchlib); the ONNX
column lists the ops it typically emits.

| Op | Category | ONNX | Notes |
|---|---|---|---|
"""


def supported_ops_markdown() -> str:
    """The table of supported inputs and ops, as written to ``docs/pytorch_ops.md``."""
    rows = []
    for namespace, name in TORCH_OPS.keys():
        entry = TORCH_OPS.lookup(name, domain=namespace)
        onnx_ops = ", ".join(entry.onnx) if entry.onnx else "(removed)"
        rows.append(f"| `{entry.qualified}` | {entry.category} | {onnx_ops} | {entry.note} |")
    return DOC_HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(supported_ops_markdown(), end="")
