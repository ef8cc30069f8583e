"""TorchScript modules that keep state in attributes between calls (``prim::SetAttr``, as
silero-vad's ``.jit`` VAD): the state is lifted to graph inputs and ``<attribute>_out`` outputs,
and a stream through edgeinfer, fed back call after call from ``initial_state``, matches the
TorchScript module called as many times."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import edgeinfer as ei
from edgeinfer.converters.pytorch import state as lifting
from edgeinfer.errors import ConversionError

from .pytorch_checks import assert_outputs_close

CALLS = 6


class Smoother(nn.Module):
    """An exponential moving average updated only on positive chunks (a state assigned inside a
    data-dependent branch), a context buffer concatenated before each chunk (silero's
    ``_context``), a call counter (int) and a flag that flips (bool)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.average = torch.zeros(1, 4)
        self.context = torch.full((1, 3), 0.5)
        self.calls = 0
        self.odd = False

    def forward(self, x):
        y = self.linear(x)
        if bool(y.sum() > 0):
            self.average = 0.8 * self.average + 0.2 * y
        full = torch.cat([self.context, x], 1)
        self.context = full[:, -3:]
        self.calls = self.calls + 1
        self.odd = not self.odd
        out = self.average * full.sum()
        if self.odd:
            out = out * 2.0
        return out + self.calls, full


class Lazy(nn.Module):
    """silero's pattern: state starts as an empty tensor that the first call replaces, and a
    batch size remembered from the previous call resets the state when it changes."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.hidden = torch.zeros(0)
        self.last_batch = 0

    def forward(self, x):
        if self.last_batch != 0 and self.last_batch != x.shape[0]:
            self.hidden = torch.zeros([0])
        if not bool(len(self.hidden)):
            self.hidden = torch.zeros(x.shape[0], 3)
        self.hidden = torch.tanh(self.linear(x) + 0.5 * self.hidden)
        self.last_batch = x.shape[0]
        return self.hidden.sum(1)


class History(nn.Module):
    def __init__(self):
        super().__init__()
        self.history = [torch.zeros(1)]

    def forward(self, x):
        self.history = self.history + [x]
        return x * float(len(self.history))


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1
        return x * 2.0


def _fresh(cls, seed: int = 0):
    torch.manual_seed(seed)
    return torch.jit.script(cls().eval())


def _chunks(shape, count: int = CALLS) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(*shape, generator=generator) for _ in range(count)]


def _stream_matches(model: ei.Model, reference, chunks: list[torch.Tensor], attributes: list[str]) -> None:
    """Run ``chunks`` through ``model`` feeding its state back and through ``reference`` (a
    fresh scripted module); every call's outputs and state must agree."""
    feeds = lifting.initial_state(model)
    carry = lifting.state_outputs(model)
    state_names = set(carry.values())
    with ei.Session(model, backend="numpy") as session:
        for step, chunk in enumerate(chunks):
            got = session.run({model.inputs[0].name: chunk.numpy(), **feeds})
            with torch.no_grad():
                expected = reference(chunk)
            expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
            own = [value for name, value in got.items() if name not in state_names]
            assert_outputs_close(own, [e.numpy() for e in expected], f"call {step}")
            for attribute in attributes:
                want = getattr(reference, attribute)
                want = want.numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
                assert_outputs_close([got[carry[attribute]]], [want], f"call {step} state {attribute}")
            feeds = {name: got[output] for name, output in carry.items()}


def test_stateful_module_streams_like_torchscript() -> None:
    model = ei.convert(_fresh(Smoother), example_inputs=(torch.randn(1, 4),))
    attributes = ["average", "context", "calls", "odd"]
    assert [i.name for i in model.inputs] == ["x", *attributes]
    assert [o.name for o in model.outputs][-4:] == [f"{a}{lifting.OUTPUT_SUFFIX}" for a in attributes]
    start = lifting.initial_state(model)
    assert start["calls"].dtype == np.int64 and start["odd"].dtype == np.bool_
    np.testing.assert_array_equal(start["context"], _fresh(Smoother).context.numpy())
    chunks = _chunks((1, 4))
    reference = _fresh(Smoother)
    with torch.no_grad():
        signs = [bool(reference.linear(c).sum() > 0) for c in chunks]
    assert len(set(signs)) == 2, "the chunks must take both sides of the branch that assigns the average"
    _stream_matches(model, reference, chunks, attributes)


def test_state_starting_empty_starts_at_zeros_and_settled_scalars_are_baked(tmp_path) -> None:
    model = ei.convert(_fresh(Lazy), example_inputs=(torch.randn(2, 3),))
    assert [i.name for i in model.inputs] == ["x", "hidden"]
    assert lifting.initial_state(model)["hidden"].shape == (2, 3)
    baked = [e for e in json.loads(model.graph.metadata[lifting.STATE_KEY]) if "baked" in e]
    assert baked == [{"attribute": "last_batch", "baked": 2}]
    path = tmp_path / "lazy.eim"
    model.save(path)
    _stream_matches(ei.load(path), _fresh(Lazy), _chunks((2, 3)), ["hidden"])


def test_int_state_alone_is_lifted() -> None:
    model = ei.convert(_fresh(Counter), example_inputs=(torch.randn(2, 3),))
    _stream_matches(model, _fresh(Counter), _chunks((2, 3), 3), ["calls"])


def test_state_of_another_kind_is_refused_naming_the_attribute() -> None:
    with pytest.raises(ConversionError, match=r"'history' of type List\[Tensor\].*Tensor, int, float or bool"):
        ei.convert(_fresh(History), example_inputs=(torch.randn(2, 3),))


def test_state_with_dynamic_batch_is_refused() -> None:
    with pytest.raises(ConversionError, match="keeps state in module attributes.*without dynamic_batch"):
        ei.convert(_fresh(Smoother), example_inputs=(torch.randn(1, 4),), dynamic_batch=True)
