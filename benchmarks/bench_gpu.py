"""The torch backend on a GPU: latency against raw PyTorch eager on the same network, and a
CPU(onnxruntime) + GPU(torch) stream against all-CPU and all-GPU.

    python benchmarks/bench_gpu.py                      # cuda:0, the full figures (< 10 min on one GPU)
    python benchmarks/bench_gpu.py --device cpu --quick # the same steps, small, on the CPU (a dry run)

Latency (``latency`` rows): ResNet-50, MobileNetV2 (224x224) and a BERT-base-sized encoder block
(seq 128, d 768, 12 heads) from ``devkit.zoo`` at batch 1 and 8. Contenders:

- ``eager fp32`` / ``eager fp16``: the same network written directly as a ``torch.nn`` module
  (Conv2d + BatchNorm2d + ReLU, ...; ``build_eager``) carrying the zoo model's weights, in eval
  mode under ``inference_mode``; fp16 is ``module.half()``;
- ``torch fp32`` / ``torch fp16``, each with and without ``cuda_graphs``: ``ei.Session(model,
  backend="torch", device=...)`` on the converted model (optimize=2: BN folded, fused ops).

Every contender is timed the same way: numpy in, numpy out (host-to-device copy, compute,
device-to-host copy, synchronized), median of ``--rounds`` after ``--warmup`` runs. The torch
backend's fp32 outputs are checked against eager fp32 (the same weights) before timing.

Stream (``stream`` rows): uint8 NHWC images -> preprocessing (Cast, Transpose, Resize, normalize)
-> MobileNetV2 -> Softmax. All-CPU: onnxruntime for everything; all-GPU: torch for everything;
CPU+GPU: a two-stage pipeline (edgeinfer's ``Pipeline``): preprocessing on onnxruntime (CPU), the
network and Softmax on torch (GPU); requests per second over ``--requests`` requests.

The script runs from a source checkout with only numpy, onnx, onnxruntime, torch and ml_dtypes
installed (``gpu_check.sh`` checks and says what is missing).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

REQUIRED = ("numpy", "onnx", "onnxruntime", "torch", "ml_dtypes")


def require_packages() -> None:
    missing = []
    for name in REQUIRED:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if missing:
        sys.exit(f"bench_gpu.py: missing package(s): {', '.join(missing)}; install them (no others are needed)")


def use_source_checkout() -> None:
    """Import edgeinfer from this checkout whether or not it is installed: ``backends/`` and
    ``converters/`` are ``edgeinfer.backends`` / ``edgeinfer.converters`` (setup.py's mapping)."""
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    import edgeinfer

    if str(root) not in edgeinfer.__path__ and not importlib.util.find_spec("edgeinfer.backends"):
        edgeinfer.__path__.append(str(root))


require_packages()
use_source_checkout()

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from onnx import TensorProto, compose, helper, numpy_helper  # noqa: E402
from torch import nn  # noqa: E402

import edgeinfer as ei  # noqa: E402
from devkit import zoo  # noqa: E402
from edgeinfer.backend import get_backend  # noqa: E402
from edgeinfer.backends.torch.backend import link_bytes_per_second  # noqa: E402
from edgeinfer.runtime.compile import compile  # noqa: E402
from edgeinfer.runtime.stream.pipeline import Pipeline  # noqa: E402
from edgeinfer.runtime.stream.stages import Stage, StagePlan  # noqa: E402


# -- the same networks, written directly in torch -----------------------------------------------
class ConvBN(nn.Sequential):
    def __init__(self, weights: dict[str, torch.Tensor], name: str, *, stride: int = 1, group: int = 1,
                 act: str | None = "relu"):
        weight = weights[f"{name}.conv.weight"]
        out_channels, _, kernel, _ = weight.shape
        conv = nn.Conv2d(weight.shape[1] * group, out_channels, kernel, stride, kernel // 2, groups=group, bias=False)
        conv.weight = nn.Parameter(weight)
        bn = nn.BatchNorm2d(out_channels, eps=zoo.BN_EPSILON)
        for field, attr in (("scale", "weight"), ("bias", "bias")):
            setattr(bn, attr, nn.Parameter(weights[f"{name}.bn.{field}"]))
        bn.running_mean.copy_(weights[f"{name}.bn.mean"])
        bn.running_var.copy_(weights[f"{name}.bn.var"])
        layers = [conv, bn]
        if act == "relu":
            layers.append(nn.ReLU())
        elif act == "relu6":
            layers.append(nn.ReLU6())
        super().__init__(*layers)


class Head(nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.fc = nn.Linear(weights["head.fc.weight"].shape[1], weights["head.fc.weight"].shape[0])
        self.fc.weight = nn.Parameter(weights["head.fc.weight"])
        self.fc.bias = nn.Parameter(weights["head.fc.bias"])

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Bottleneck(nn.Module):
    def __init__(self, weights, name, stride, downsample):
        super().__init__()
        self.body = nn.Sequential(ConvBN(weights, f"{name}.1"), ConvBN(weights, f"{name}.2", stride=stride),
                                  ConvBN(weights, f"{name}.3", act=None))
        self.downsample = ConvBN(weights, f"{name}.downsample", stride=stride, act=None) if downsample else None

    def forward(self, x):
        shortcut = self.downsample(x) if self.downsample is not None else x
        return torch.relu(shortcut + self.body(x))


class ResNet50(nn.Module):
    def __init__(self, weights):
        super().__init__()
        layers = [ConvBN(weights, "stem", stride=2), nn.MaxPool2d(3, 2, 1)]
        for stage, blocks in enumerate((3, 4, 6, 3), start=1):
            for index in range(blocks):
                stride = 2 if index == 0 and stage > 1 else 1
                layers.append(Bottleneck(weights, f"layer{stage}.{index}", stride, index == 0))
        self.features = nn.Sequential(*layers)
        self.head = Head(weights)

    def forward(self, x):
        return self.head(self.features(x))


class InvertedResidual(nn.Module):
    def __init__(self, weights, name, expansion, stride, hidden, residual):
        super().__init__()
        layers = [ConvBN(weights, f"{name}.expand", act="relu6")] if expansion != 1 else []
        layers += [ConvBN(weights, f"{name}.dw", stride=stride, group=hidden, act="relu6"),
                   ConvBN(weights, f"{name}.project", act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = residual

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self, weights):
        super().__init__()
        layers = [ConvBN(weights, "stem", stride=2, act="relu6")]
        channels, block = weights["stem.conv.weight"].shape[0], 0
        for expansion, _, repeats, first_stride in zoo.MOBILENET_V2_SETTINGS:
            for repeat in range(repeats):
                name = f"block{block}"
                out_channels = weights[f"{name}.project.conv.weight"].shape[0]
                stride = first_stride if repeat == 0 else 1
                layers.append(InvertedResidual(weights, name, expansion, stride, channels * expansion,
                                               stride == 1 and channels == out_channels))
                channels, block = out_channels, block + 1
        layers.append(ConvBN(weights, "last", act="relu6"))
        self.features = nn.Sequential(*layers)
        self.head = Head(weights)

    def forward(self, x):
        return self.head(self.features(x))


class EncoderBlock(nn.Module):
    """``zoo.transformer_encoder_block``: pre-LN attention and GELU FFN, residual adds."""

    def __init__(self, weights, heads):
        super().__init__()
        d = weights["ln1.scale"].shape[0]
        self.heads = heads
        self.norms = nn.ModuleList()
        for name in ("ln1", "ln2"):
            norm = nn.LayerNorm(d, eps=1e-5)
            norm.weight, norm.bias = nn.Parameter(weights[f"{name}.scale"]), nn.Parameter(weights[f"{name}.bias"])
            self.norms.append(norm)
        self.dense = nn.ModuleDict()
        for name in ("attn.q", "attn.k", "attn.v", "attn.out", "ffn.up", "ffn.down"):
            weight = weights[f"{name}.weight"]  # [in, out], a MatMul's right operand
            linear = nn.Linear(*weight.shape)
            linear.weight, linear.bias = nn.Parameter(weight.T.contiguous()), nn.Parameter(weights[f"{name}.bias"])
            self.dense[name.replace(".", "_")] = linear

    def forward(self, x):
        batch, seq, d = x.shape
        h = self.norms[0](x)

        def heads(name):
            return self.dense[name](h).reshape(batch, seq, self.heads, -1).transpose(1, 2)

        q, k, v = heads("attn_q"), heads("attn_k"), heads("attn_v")
        scores = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        context = (scores @ v).transpose(1, 2).reshape(batch, seq, d)
        x = x + self.dense["attn_out"](context)
        return x + self.dense["ffn_down"](F.gelu(self.dense["ffn_up"](self.norms[1](x))))


def build_eager(name: str, proto: onnx.ModelProto, heads: int) -> nn.Module:
    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in proto.graph.initializer}
    module = {"resnet50": ResNet50, "mobilenet_v2": MobileNetV2}[name](weights) if name != "encoder" else \
        EncoderBlock(weights, heads)
    return module.eval()


# -- models ---------------------------------------------------------------------------------------
def model_proto(name: str, batch: int, quick: bool) -> tuple[onnx.ModelProto, int]:
    """(the zoo model, its head count) at the benchmark's size (``quick``: small)."""
    size = 32 if quick else 224
    if name == "resnet50":
        return zoo.resnet50(batch=batch, size=size), 0
    if name == "mobilenet_v2":
        return zoo.mobilenet_v2(size, batch=batch), 0
    seq, d, heads = (16, 64, 4) if quick else (128, 768, 12)
    return zoo.transformer_encoder_block(seq, d, heads, batch=batch), heads


# -- timing ---------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(call, device: torch.device, rounds: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    sync(device)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        sync(device)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples) * 1e3)


def eager_call(module: nn.Module, feeds: dict[str, np.ndarray], device: torch.device, half: bool):
    (array,) = feeds.values()

    def call():
        with torch.inference_mode():
            x = torch.from_numpy(array).to(device, non_blocking=True)
            return module(x.half() if half else x).float().cpu().numpy()

    return call


def bench_latency(name: str, batch: int, args, device: torch.device) -> dict[str, Any]:
    proto, heads = model_proto(name, batch, args.quick)
    feeds = zoo.example_inputs(proto)
    model = ei.convert(proto, optimize=2)
    eager = build_eager(name, proto, heads).to(device)
    row: dict[str, Any] = {"model": name, "batch": batch}
    reference = eager_call(eager, feeds, device, False)()
    row["eager fp32"] = median_ms(eager_call(eager, feeds, device, False), device, args.rounds, args.warmup)
    graphs = [False, True] if device.type == "cuda" else [False]
    # half precision on a CPU is checked by the tests; torch's CPU fp16 kernels are no benchmark
    precisions = ("fp32", "fp16") if device.type != "cpu" else ("fp32",)
    for precision in precisions:
        for cuda_graphs in graphs:
            label = f"torch {precision}" + (" graphs" if cuda_graphs else "")
            options = {"cuda_graphs": True} if cuda_graphs else {}
            with ei.Session(model, backend="torch", device=str(device), precision=precision, **options) as session:
                (output,) = session.run(feeds).values()
                scale = float(np.abs(reference).max())
                row[f"{label} max diff"] = float(np.abs(output - reference).max() / scale)
                if precision == "fp32" and row[f"{label} max diff"] > 1e-3:
                    raise SystemExit(f"{name} batch {batch}: the torch backend differs from eager by "
                                     f"{row[f'{label} max diff']:.2e} of the output scale")
                row[label] = median_ms(lambda s=session: s.run(feeds), device, args.rounds, args.warmup)
    row["fp32 vs eager"] = row["torch fp32"] / row["eager fp32"]
    if "fp16" in precisions:
        half = build_eager(name, proto, heads).to(device).half()
        row["eager fp16"] = median_ms(eager_call(half, feeds, device, True), device, args.rounds, args.warmup)
        row["eager fp32 / best fp16"] = row["eager fp32"] / row.get("torch fp16 graphs", row["torch fp16"])
    return row


# -- the CPU + GPU stream ---------------------------------------------------------------------------
def preprocessing(batch: int, raw: int, size: int) -> onnx.ModelProto:
    """uint8 NHWC [batch, raw, raw, 3] -> normalized float NCHW [batch, 3, size, size] ("input")."""
    mean = numpy_helper.from_array(np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1) * 255, "mean")
    std = numpy_helper.from_array(np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1) * 255, "std")
    sizes = numpy_helper.from_array(np.array([batch, 3, size, size], np.int64), "sizes")
    nodes = [helper.make_node("Cast", ["image"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Transpose", ["f"], ["nchw"], perm=[0, 3, 1, 2]),
             helper.make_node("Resize", ["nchw", "", "", "sizes"], ["resized"], mode="linear"),
             helper.make_node("Sub", ["resized", "mean"], ["centered"]),
             helper.make_node("Div", ["centered", "std"], ["input"])]
    graph = helper.make_graph(nodes, "preprocessing",
                              [helper.make_tensor_value_info("image", TensorProto.UINT8, [batch, raw, raw, 3])],
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, size, size])],
                              [mean, std, sizes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", zoo.OPSET)], ir_version=zoo.IR_VERSION)


def stream_model(batch: int, quick: bool) -> onnx.ModelProto:
    size = 32 if quick else 224
    net = zoo.mobilenet_v2(size, batch=batch)
    softmax = helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)
    net.graph.node.append(softmax)
    del net.graph.output[:]
    net.graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 1000]))
    return compose.merge_models(preprocessing(batch, size + size // 7, size), net, io_map=[("input", "input")])


def _stage(graph, nodes, backend, keep) -> Stage:
    sub = graph.subgraph(graph.nodes[nodes.start:nodes.stop], name=f"{graph.name}_{backend.name}")
    _, runner = compile(sub, [backend], busy_wait=False)
    return Stage(nodes, [runner], frozenset(keep))


def requests_per_second(serve, requests: list[dict[str, np.ndarray]]) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in serve(requests))
    return count / (time.perf_counter() - start)


def bench_stream(args, device: torch.device) -> dict[str, Any]:
    proto = stream_model(args.stream_batch, args.quick)
    model = ei.convert(proto, optimize=2)
    graph = model.graph
    rng = np.random.default_rng(0)
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    requests = [{"image": rng.integers(0, 256, shape).astype(np.uint8)} for _ in range(args.requests)]
    row: dict[str, Any] = {"model": "preprocessing + mobilenet_v2 + softmax", "batch": args.stream_batch,
                           "requests": args.requests}
    with ei.Session(model, backend="onnxruntime") as cpu:
        reference = cpu.run(requests[0])["probs"]
        cpu.run(requests[0])
        row["all-CPU onnxruntime req/s"] = requests_per_second(lambda rs: map(cpu.run, rs), requests)
    with ei.Session(model, backend="torch", device=str(device)) as gpu:
        gpu.run(requests[0])
        row["all-GPU torch req/s"] = requests_per_second(lambda rs: map(gpu.run, rs), requests)
    cut = next(i for i, node in enumerate(graph.nodes) if node.op_type in ("Conv", "FusedConv"))
    cpu_backend = get_backend("onnxruntime")
    gpu_backend = get_backend("torch", device=str(device))
    stages = [_stage(graph, range(0, cut), cpu_backend, {"input"}),
              _stage(graph, range(cut, len(graph.nodes)), gpu_backend, set(graph.output_names))]
    seconds = []
    for stage in stages:
        start = time.perf_counter()
        message = stage.run(requests[0] if stage is stages[0] else stages[0].run(requests[0]))
        seconds.append(time.perf_counter() - start)
    plan = StagePlan(stages, [1, 1], seconds, 1, list(graph.output_names))
    # each stage alone, steady (the pipeline's rate is bounded by the slower one)
    handoff = stages[0].run(requests[0])
    row["CPU stage ms"] = median_ms(lambda: stages[0].run(requests[0]), device, args.rounds, args.warmup)
    row["GPU stage ms"] = median_ms(lambda: stages[1].run(handoff), device, args.rounds, args.warmup)
    got = stages[1].run(stages[0].run(requests[0]))["probs"]
    row["CPU+GPU max diff"] = float(np.abs(got - reference).max())
    pipeline = Pipeline(plan)
    try:
        row["CPU+GPU pipeline req/s"] = requests_per_second(pipeline.serve, requests)
    finally:
        pipeline.close()
    del message
    faster = max(row["all-CPU onnxruntime req/s"], row["all-GPU torch req/s"])
    row["pipeline / faster of the two"] = row["CPU+GPU pipeline req/s"] / faster
    row.update(planned_stream(model, requests, device, reference))
    return row


def planned_stream(model, requests, device: torch.device, reference) -> dict[str, Any]:
    """The product path: a Session over torch on the device and onnxruntime on the CPU whose
    stream planner chooses the stages (charging host<->device cuts with the measured link)."""
    try:
        with ei.Session(model, backend=[f"torch@{device}", "onnxruntime"]) as session:
            first = session.run(requests[0])["probs"]
            plan = session.pipeline_plan(requests[0], stages="auto", replicas="auto")
            list(session.stream(requests[:4], stages="auto", replicas="auto", plan="first"))
            rate = requests_per_second(lambda rs: session.stream(rs, stages="auto", replicas="auto", plan="first"),
                                       requests)
            return {"planned req/s": rate, "planned max diff": float(np.abs(first - reference).max()),
                    "placement": " + ".join(f"{p.backend}[{len(p.nodes)}]" for p in session.plan.parts),
                    "planned stages": plan.describe().replace("\n", " | ")[:400]}
    except Exception as exc:  # noqa: BLE001  (recorded in the row; the fixed rows above stand)
        return {"planned error": f"{type(exc).__name__}: {exc}"[:500]}


# -- main -------------------------------------------------------------------------------------------
def environment(device: torch.device) -> dict[str, Any]:
    import onnxruntime

    facts = {"python": platform.python_version(), "torch": torch.__version__, "onnx": onnx.__version__,
             "onnxruntime": onnxruntime.__version__, "device": str(device)}
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["tf32"] = bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)
        # the probe the stream planner charges host<->device cuts with (pinned host memory)
        facts["link GB/s"] = {f"{src}->{dst}": round(rate / 1e9, 2)
                              for (src, dst), rate in link_bytes_per_second(device).items()}
    return facts


def print_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        fields = ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
        print(f"  {fields}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0", help="a torch device: cuda:N (default cuda:0) or cpu")
    parser.add_argument("--quick", action="store_true", help="small models and few rounds (a dry run)")
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2", "encoder"],
                        choices=["resnet50", "mobilenet_v2", "encoder"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--rounds", type=int, default=None, help="timed runs per contender (default 50; quick 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 10; quick 3)")
    parser.add_argument("--requests", type=int, default=None, help="stream requests (default 200; quick 8)")
    parser.add_argument("--stream-batch", type=int, default=8)
    parser.add_argument("--skip-stream", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (5 if args.quick else 50)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
    args.requests = args.requests or (8 if args.quick else 200)
    if args.quick:
        args.stream_batch = min(args.stream_batch, 2)
        args.batches = [1]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench_gpu.py: device {args.device} requested, but torch {torch.__version__} sees no CUDA device "
                 "(--device cpu runs the dry run)")
    if device.type == "cuda":
        # fp32 rows are IEEE float32 on both sides: cuDNN would otherwise run float32
        # convolutions in TF32 (torch's default), 5e-3 of ResNet-50's output scale off float32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    if device.type == "cpu":
        # the dry run: torch's OpenMP workers spin while waiting, and on a shared machine one
        # descheduled worker stalls each op (2 threads ran ResNet-50/32px 10-50x slower than 1)
        torch.set_num_threads(1)
    results: dict[str, Any] = {"environment": environment(device), "latency_ms": [], "stream": None}
    print(json.dumps(results["environment"]), flush=True)
    failures = 0

    def attempt(what: str, measure) -> dict[str, Any]:
        # one failing row must not cost the others: a GPU lease is short, so every row that can
        # be measured is, the failure is recorded with it, and the exit status says so
        nonlocal failures
        try:
            row = measure()
        except (Exception, SystemExit) as exc:  # noqa: BLE001  (recorded, and the exit status is 1)
            failures += 1
            row = {"model": what, "error": f"{type(exc).__name__}: {exc}"}
        print_rows([row])
        return row

    def save() -> None:  # after every row, so a run stopped at its time limit keeps what it measured
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))

    print("latency (ms, numpy in and out, median):", flush=True)
    for name in args.models:
        for batch in dict.fromkeys(args.batches):
            row = attempt(f"{name} batch {batch}", lambda n=name, b=batch: bench_latency(n, b, args, device))
            results["latency_ms"].append(row)
            save()
    if not args.skip_stream:
        print("stream (requests/s):", flush=True)
        results["stream"] = attempt("stream", lambda: bench_stream(args, device))
        save()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
