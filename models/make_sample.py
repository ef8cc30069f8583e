"""Write the README's sample model: ``sample_cnn.onnx`` and ``sample_input.npy``.

Both files are deterministic (fixed seeds), so re-running this script reproduces them byte for
byte and they can be committed. Usage::

    python models/make_sample.py [--out FOLDER]
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: devkit/ is not installed

from devkit import zoo
from edgeinfer.format.atomic import atomic_write_bytes

MODEL_SEED = 2024
INPUT_SEED = 7
SIZE = 64
CHANNELS = 32


def build() -> tuple[bytes, bytes]:
    """The serialized sample model and its example input (``.npy`` bytes)."""
    model = zoo.cnn_residual_depthwise(size=SIZE, channels=CHANNELS, classes=10, seed=MODEL_SEED)
    model.doc_string = ("edgeinfer sample CNN (models/make_sample.py): conv+BN+ReLU stem, residual block, "
                        "depthwise 3x3 + pointwise with ReLU6, MaxPool, GlobalAveragePool, Gemm; "
                        "random weights")
    feeds = zoo.example_inputs(model, seed=INPUT_SEED)
    buffer = io.BytesIO()
    np.save(buffer, feeds["input"], allow_pickle=False)
    return model.SerializeToString(), buffer.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="folder to write into (default: this script's folder)")
    args = parser.parse_args(argv)
    model_bytes, input_bytes = build()
    atomic_write_bytes(args.out / "sample_cnn.onnx", model_bytes)
    atomic_write_bytes(args.out / "sample_input.npy", input_bytes)
    print(f"wrote {args.out / 'sample_cnn.onnx'} ({len(model_bytes)} bytes) and "
          f"{args.out / 'sample_input.npy'} ({len(input_bytes)} bytes)")


if __name__ == "__main__":
    main()
