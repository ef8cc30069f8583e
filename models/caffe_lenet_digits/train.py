"""Train a small LeNet on scikit-learn's 8x8 digits and write it as a Caffe model.

    python models/caffe_lenet_digits/train.py

Writes ``lenet_digits.prototxt`` (V2 layers, deploy form) and ``lenet_digits.caffemodel``
(binary NetParameter) next to this script with edgeinfer's own Caffe writer, so the files
are what Caffe would produce for the same weights. The net takes raw digits pixels (0..16):
its first layer scales them to 0..1. Training is seeded and takes a few seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from edgeinfer.converters.caffe import write_caffemodel

HERE = Path(__file__).resolve().parent
PROTOTXT = HERE / "lenet_digits.prototxt"
CAFFEMODEL = HERE / "lenet_digits.caffemodel"
SEED = 0

DEPLOY = """name: "LeNetDigits"
input: "data"
input_shape { dim: 1 dim: 1 dim: 8 dim: 8 }
layer { name: "scale" type: "Power" bottom: "data" top: "scaled" power_param { scale: 0.0625 } }
layer { name: "conv1" type: "Convolution" bottom: "scaled" top: "conv1"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 32 kernel_size: 3 pad: 1 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 64 } }
layer { name: "relu3" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "drop1" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "ip2" top: "prob" }
"""


def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 1, 8, 8) float32 pixels 0..16 and labels; 75 % train, 25 % held out."""
    digits = load_digits()
    images = digits.images.astype(np.float32)[:, None]
    return train_test_split(images, digits.target, test_size=0.25, random_state=SEED, stratify=digits.target)


def build():
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 2 * 2, 64), torch.nn.ReLU(), torch.nn.Dropout(0.3),
        torch.nn.Linear(64, 10))


def train(x_train: np.ndarray, y_train: np.ndarray, epochs: int = 60):
    """Adam on cross-entropy; torch is imported here so evaluate.py does not need it."""
    import torch

    torch.manual_seed(SEED)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    inputs, labels = torch.from_numpy(x_train / 16.0), torch.from_numpy(y_train).long()
    generator = torch.Generator().manual_seed(SEED)
    for _ in range(epochs):
        model.train()
        for batch in torch.randperm(len(inputs), generator=generator).split(64):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
            loss.backward()
            optimizer.step()
    return model.eval()


def caffe_layers(model) -> list[tuple[str, str, list[np.ndarray]]]:
    """Torch parameters in Caffe's blob layouts (they coincide: OIHW convs, (out, in) products)."""
    def blobs(module) -> list[np.ndarray]:
        return [module.weight.detach().numpy(), module.bias.detach().numpy()]

    return [("conv1", "Convolution", blobs(model[0])), ("conv2", "Convolution", blobs(model[3])),
            ("ip1", "InnerProduct", blobs(model[7])), ("ip2", "InnerProduct", blobs(model[10]))]


def main() -> None:
    x_train, x_test, y_train, y_test = split()
    import torch

    model = train(x_train, y_train)
    with torch.no_grad():
        predicted = model(torch.from_numpy(x_test / 16.0)).argmax(1).numpy()
    print(f"PyTorch held-out accuracy: {np.mean(predicted == y_test):.4f} on {len(y_test)} images")
    PROTOTXT.write_text(DEPLOY)
    write_caffemodel(CAFFEMODEL, caffe_layers(model))
    print(f"wrote {PROTOTXT.name} and {CAFFEMODEL.name} ({CAFFEMODEL.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
