"""The model zoo of the PyTorch converter issue, converted once each and checked against
PyTorch eager on the numpy backend, after an ``.eim`` round trip and in onnxruntime."""

from __future__ import annotations

import functools

import pytest
import torch
from pytorch_checks import assert_outputs_close, eager, run_numpy, run_onnxruntime
from pytorch_zoo import ZOO

import edgeinfer as ei

# Converted with a symbolic batch and run at batch 1 and 5; the rest at a fixed batch of 2
# (a symbolic batch makes torch's decomposition pass several times slower).
DYNAMIC = ("lenet", "squeezenet_style", "unet_style", "bert_style", "gru")
STATIC_BATCH = 2


def batches(name: str) -> tuple[int, ...]:
    return (1, 5) if name in DYNAMIC else (STATIC_BATCH,)


@functools.cache
def converted(name: str) -> tuple[torch.nn.Module, ei.Model]:
    entry = ZOO[name]
    module = entry.model()
    dynamic = name in DYNAMIC
    example = entry.inputs(1 if dynamic else STATIC_BATCH)
    model = ei.convert(module, example_inputs=example, input_names=list(entry.input_names), dynamic_batch=dynamic)
    return module, model


@pytest.mark.parametrize("name", list(ZOO))
def test_numpy_backend_matches_eager(name: str) -> None:
    module, model = converted(name)
    for batch in batches(name):
        inputs = ZOO[name].inputs(batch)
        assert_outputs_close(run_numpy(model, inputs), eager(module, inputs), f"{name} batch {batch}")


@pytest.mark.parametrize("name", list(ZOO))
def test_eim_round_trip(name: str, tmp_path) -> None:
    module, model = converted(name)
    path = tmp_path / f"{name}.eim"
    model.save(path)
    loaded = ei.load(path)
    assert [t.name for t in loaded.inputs] == list(ZOO[name].input_names)
    inputs = ZOO[name].inputs(batches(name)[-1])
    assert_outputs_close(run_numpy(loaded, inputs), eager(module, inputs), f"{name} from .eim")


@pytest.mark.parametrize("name", list(ZOO))
def test_onnx_export_runs_in_onnxruntime(name: str) -> None:
    module, model = converted(name)
    for batch in batches(name):
        inputs = ZOO[name].inputs(batch)
        assert_outputs_close(run_onnxruntime(model, inputs), eager(module, inputs), f"{name} onnxruntime batch {batch}")


@pytest.mark.parametrize("name", DYNAMIC)
def test_symbolic_batch_is_named_n(name: str) -> None:
    _, model = converted(name)
    assert [t.shape[0] for t in model.inputs] == ["N"] * len(model.inputs)
    assert all(t.shape[0] == "N" for t in model.outputs), model.outputs
    assert model.metadata["source_format"] == "pytorch"


@pytest.mark.parametrize("name", ["resnet18_style", "bert_style"])
def test_core_aten_program_converts(name: str) -> None:
    """Programs decomposed to core ATen (``run_decompositions``), as ``.pt2`` files often are."""
    entry = ZOO[name]
    module = entry.model()
    inputs = entry.inputs(STATIC_BATCH)
    program = torch.export.export(module, inputs).run_decompositions()
    model = ei.convert(program, input_names=list(entry.input_names))
    assert_outputs_close(run_numpy(model, inputs), eager(module, inputs), f"{name} core ATen")


def test_conversion_leaves_the_module_in_training_mode_it_had() -> None:
    module = ZOO["mlp"].model().train()
    ei.convert(module, example_inputs=ZOO["mlp"].inputs(2))
    assert all(m.training for m in module.modules())
