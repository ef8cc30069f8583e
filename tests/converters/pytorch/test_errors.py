"""Bad input to the PyTorch front end raises a typed error saying what, where and how to fix."""

from __future__ import annotations

import pytest
import torch
from pytorch_checks import assert_outputs_close, eager, run_numpy
from torch import nn

import edgeinfer as ei
from edgeinfer.converters import pytorch as frontend
from edgeinfer.errors import ConversionError, UnsupportedOpError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


class Angle(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.atan2(x, x + 1.0)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), Angle())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(self.block(x), dim=1)


def test_unsupported_op_names_the_op_and_the_module_path() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        ei.convert(Outer(), example_inputs=(torch.randn(2, 4),))
    message = str(info.value)
    assert "aten::atan2" in message and "module 'block.1'" in message and "Angle" in message
    assert "test_errors.py" in message  # the source line that called it
    assert "also unsupported: aten::cumprod" in message and "docs/pytorch_ops.md" in message


def test_batch_norm_exported_in_training_mode_is_refused() -> None:
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    program = torch.export.export(module, (torch.randn(2, 3, 8, 8),))
    with pytest.raises(UnsupportedOpError, match=r"aten::batch_norm .*module '1'.*training mode.*model.eval\(\)"):
        ei.convert(program)


def test_complex_tensors_are_refused() -> None:
    class Complex(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.view_as_real(x.to(torch.complex64) * 2)

    with pytest.raises(UnsupportedOpError, match="complex"):
        ei.convert(Complex(), example_inputs=(torch.randn(2, 3),))


def test_module_without_examples_or_shapes() -> None:
    with pytest.raises(ConversionError, match=r"example_inputs=\(tensor, \.\.\.\) or input_shapes"):
        ei.convert(nn.Linear(3, 2))


def test_module_from_input_shapes_uses_the_given_names() -> None:
    module = nn.Sequential(nn.Linear(3, 2), nn.ReLU()).eval()
    model = ei.convert(module, input_shapes={"features": (1, 3)}, dynamic_batch=True)
    assert model.inputs[0].name == "features" and model.inputs[0].shape == ("N", 3)
    inputs = (torch.randn(4, 3),)
    assert_outputs_close(run_numpy(model, inputs), eager(module, inputs), "linear from input_shapes")


def test_input_names_count_must_match() -> None:
    with pytest.raises(ConversionError, match=r"input_names has 2 names \['a', 'b'\], but the model takes 1"):
        ei.convert(nn.Linear(3, 2), example_inputs=(torch.randn(2, 3),), input_names=["a", "b"])


def test_output_names_count_must_match() -> None:
    with pytest.raises(ConversionError, match=r"output_names has 2 names .* returns 1 tensor"):
        ei.convert(nn.Linear(3, 2), example_inputs=(torch.randn(2, 3),), output_names=["a", "b"])


def test_unknown_option_is_refused() -> None:
    with pytest.raises(ConversionError, match=r"unknown option\(s\) \['opset'\]"):
        frontend.convert(nn.Linear(3, 2), example_inputs=(torch.randn(2, 3),), opset=17)


def test_bad_example_inputs_type() -> None:
    with pytest.raises(ConversionError, match="example_inputs must be a tensor or a tuple"):
        ei.convert(nn.Linear(3, 2), example_inputs={"x": torch.randn(2, 3)})


def test_untraceable_model_reports_torch_export_failure() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(ConversionError, match="torch.export could not capture the model"):
        ei.convert(DataDependent(), example_inputs=(torch.randn(2, 3),))


def test_model_that_fixes_its_batch_refuses_a_dynamic_batch() -> None:
    class FixedBatch(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 12)

    with pytest.raises(ConversionError, match="the model fixes its batch size"):
        ei.convert(FixedBatch(), example_inputs=(torch.randn(2, 3, 4),), dynamic_batch=True)
