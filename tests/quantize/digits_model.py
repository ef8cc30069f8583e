"""A small CNN trained on scikit-learn's digits (8x8 grey images, 10 classes), as ONNX.

The network (Conv-BN-ReLU x2, MaxPool, Conv-ReLU, GlobalAveragePool, Flatten, Gemm) is trained
with PyTorch for a few seconds on the training split (stratified, 70%) and written as an ONNX
graph built from its weights (BatchNormalization kept as a node, so that conversion folds it).
Used by the quantization tests and by benchmarks/bench_quantize.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 0
EPOCHS = 12
CHANNELS = (32, 64, 64)


@dataclass(frozen=True)
class DigitsTask:
    model: onnx.ModelProto
    train_x: np.ndarray  # [N, 1, 8, 8] float32 in [0, 1]
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    return train_test_split(images, digits.target.astype(np.int64), test_size=0.3, random_state=SEED,
                            stratify=digits.target)


def _train(train_x: np.ndarray, train_y: np.ndarray):
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    c1, c2, c3 = CHANNELS
    net = nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c3, 10))
    optimizer = torch.optim.Adam(net.parameters(), lr=5e-3)
    x, y = torch.from_numpy(train_x), torch.from_numpy(train_y)
    generator = torch.Generator().manual_seed(SEED)
    with torch.enable_grad():
        for _ in range(EPOCHS):
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), 64):
                batch = order[start:start + 64]
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(net(x[batch]), y[batch])
                loss.backward()
                optimizer.step()
    return net.eval()


def _to_onnx(net) -> onnx.ModelProto:
    layers = list(net)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, tensor) -> str:
        inits.append(numpy_helper.from_array(tensor.detach().numpy().astype(np.float32), name))
        return name

    x = "image"
    index = 0
    for layer in layers:
        kind = type(layer).__name__
        name = f"{kind.lower()}{index}"
        index += 1
        if kind == "Conv2d":
            inputs = [x, const(f"{name}.weight", layer.weight), const(f"{name}.bias", layer.bias)]
            nodes.append(helper.make_node("Conv", inputs, [name], name=name, kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        elif kind == "BatchNorm2d":
            inputs = [x] + [const(f"{name}.{p}", getattr(layer, p))
                            for p in ("weight", "bias", "running_mean", "running_var")]
            nodes.append(helper.make_node("BatchNormalization", inputs, [name], name=name, epsilon=layer.eps))
        elif kind == "ReLU":
            nodes.append(helper.make_node("Relu", [x], [name], name=name))
        elif kind == "MaxPool2d":
            nodes.append(helper.make_node("MaxPool", [x], [name], name=name, kernel_shape=[2, 2], strides=[2, 2]))
        elif kind == "AdaptiveAvgPool2d":
            nodes.append(helper.make_node("GlobalAveragePool", [x], [name], name=name))
        elif kind == "Flatten":
            nodes.append(helper.make_node("Flatten", [x], [name], name=name, axis=1))
        elif kind == "Linear":
            inputs = [x, const(f"{name}.weight", layer.weight), const(f"{name}.bias", layer.bias)]
            nodes.append(helper.make_node("Gemm", inputs, ["logits"], name=name, transB=1))
            name = "logits"
        x = name
    graph = helper.make_graph(nodes, "digits_cnn",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@lru_cache(maxsize=1)
def digits_task() -> DigitsTask:
    """Train (once per process) and return the digits CNN with its data split."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_x, test_x, train_y, test_y = load_split()
        net = _train(train_x, train_y)
        with torch.no_grad():
            model = _to_onnx(net)
    finally:
        torch.set_num_threads(threads)
    return DigitsTask(model, train_x, train_y, test_x, test_y)


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy in percent."""
    return float(np.mean(np.argmax(logits, axis=-1) == labels) * 100.0)
