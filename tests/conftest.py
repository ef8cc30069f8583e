"""Shared fixtures: small ONNX models built from text (onnx.parser), and a CLI runner."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from devkit.testing import parse_model as parse


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def mlp_model() -> onnx.ModelProto:
    """A two-layer MLP with a symbolic batch dim N and real initializers."""
    rng = np.random.default_rng(7)
    w1 = ",".join(f"{v:.6f}" for v in rng.standard_normal(8 * 16))
    b1 = ",".join(f"{v:.6f}" for v in rng.standard_normal(16))
    w2 = ",".join(f"{v:.6f}" for v in rng.standard_normal(16 * 4))
    return parse(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        mlp (float[N, 8] x) => (float[N, 4] y)
        <float[8, 16] w1 = {{{w1}}}, float[16] b1 = {{{b1}}}, float[16, 4] w2 = {{{w2}}}>
        {{
            h = MatMul(x, w1)
            hb = Add(h, b1)
            a = Relu(hb)
            z = MatMul(a, w2)
            y = Softmax<axis = -1>(z)
        }}""")
