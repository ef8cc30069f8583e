"""Shared checks: run a converted model on the numpy backend, through ``.eim`` and through
the ONNX exporter into onnxruntime, and compare each with PyTorch eager."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

import edgeinfer as ei
from devkit.testing import assert_close

# fp32 tolerances of the PyTorch converter issue: rtol 1e-4 / atol 1e-5 (kernels and exporter
# decompositions reorder float operations relative to PyTorch's own kernels).
RTOL, ATOL = 1e-4, 1e-5


def eager(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    with torch.no_grad():
        result = module(*inputs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    return [r.numpy() for r in results]


def feeds_for(model: ei.Model, inputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
    assert len(model.inputs) == len(inputs), f"model inputs {model.inputs} vs {len(inputs)} arrays"
    return {info.name: tensor.numpy() for info, tensor in zip(model.inputs, inputs)}


def assert_outputs_close(got: dict[str, np.ndarray] | list[np.ndarray], reference: list[np.ndarray],
                         what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    values = list(got.values()) if isinstance(got, dict) else list(got)
    assert len(values) == len(reference), f"{what}: {len(values)} outputs, expected {len(reference)}"
    for index, (value, ref) in enumerate(zip(values, reference)):
        assert_close(value, ref, rtol=rtol, atol=atol, name=f"{what} output {index}")


def run_numpy(model: ei.Model, inputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
    return ei.Session(model, backend="numpy").run(feeds_for(model, inputs))


def run_onnxruntime(model: ei.Model, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    import onnxruntime as ort

    from edgeinfer.converters.onnx import export

    proto = export(model.graph)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds_for(model, inputs))
