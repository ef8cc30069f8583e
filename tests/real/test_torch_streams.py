"""The silero VAD converted from its stateless core reproduces the file's own stateful
``forward(x, 16000)`` over a stream of 512-sample chunks, with the state fed explicitly."""

from __future__ import annotations

import numpy as np
import torch

import edgeinfer as ei

from .checks import compare
from .models_torch import MODELS, VAD_RATE, VAD_SIZES, vad_chunks, vad_core, vad_feeds, vad_script

VAD = next(m for m in MODELS if m.id == "silero-vad/vad_16k")


def test_vad_stream_matches_the_stateful_file() -> None:
    chunks = vad_chunks(1.5)
    script = vad_script()
    with torch.no_grad():
        expected = [script(torch.from_numpy(chunk), VAD_RATE).numpy() for chunk in chunks]
    model = ei.convert(vad_core(), **VAD.convert_kwargs(vad_feeds()))
    state = np.zeros((2, 1, 128), np.float32)
    size = VAD_SIZES[VAD_RATE][1]
    context = np.zeros((1, size), np.float32)
    got = []
    with ei.Session(model, backend="numpy", threads=2) as session:
        for chunk in chunks:
            x = np.concatenate([context, chunk], axis=1)
            outputs = session.run({"x": x, "state": state})
            got.append(outputs["speech_prob"])
            state, context = outputs["state_out"], x[:, -size:]
    probabilities = np.concatenate(expected).ravel()
    assert probabilities.max() > 0.5 > probabilities.min(), "the stream must hold speech and silence"
    compare([np.concatenate(got)], [np.concatenate(expected)], VAD, "numpy stream over 1.5 s")


def test_the_stateful_file_streams_with_its_state_lifted() -> None:
    """The file's own ``forward(x, sr)`` keeps its state in module attributes (``_state``,
    ``_context``): converted, that state is lifted to inputs named after the attributes and
    outputs ``<name>_out``, and a stream that feeds each back reproduces the file called on
    the same chunks, probabilities and state alike."""
    from edgeinfer.converters.pytorch import initial_state, state_outputs

    from .corpus import model_file
    from .models_torch import VAD_FILE

    model = ei.convert(model_file(*VAD_FILE), example_inputs=(torch.zeros(1, VAD_SIZES[VAD_RATE][0]), VAD_RATE))
    assert model.graph.input_names == ["x", "_state", "_context"]
    assert model.graph.output_names[1:] == ["_state_out", "_context_out"]
    chunks = vad_chunks(1.5)
    script = vad_script()
    state = initial_state(model)
    back = state_outputs(model)
    with torch.no_grad(), ei.Session(model, backend="numpy") as session:
        for index, chunk in enumerate(chunks):
            expected = script(torch.from_numpy(chunk), VAD_RATE).numpy()
            outputs = session.run({"x": chunk, **state})
            compare([outputs[model.graph.output_names[0]]], [expected], VAD, f"stateful file, chunk {index}")
            state = {name: outputs[out] for name, out in back.items()}
            for name in ("_state", "_context"):
                np.testing.assert_allclose(state[name], getattr(script, name).numpy(), rtol=1e-3, atol=1e-4,
                                           err_msg=f"{name} after chunk {index}")
