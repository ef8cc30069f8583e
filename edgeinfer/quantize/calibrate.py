"""Run a float model over calibration data and collect one ``TensorHistogram`` per tensor.

The graph is re-declared with the tensors to observe as extra outputs and compiled once on a
backend (onnxruntime when installed: calibration is dominated by float inference), then every
batch of feeds updates the histograms. Progress goes to an ``edgeinfer.progress.Steps`` the caller
renders (the command line draws it); nothing here prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import closing

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.ir import Graph
from edgeinfer.progress import Steps, steps
from edgeinfer.quantize.histogram import DEFAULT_BINS, ChannelMean, TensorHistogram, ValueGrid

FLOAT_TYPES = ("float32", "float16", "float64", "bfloat16")


def float_activations(graph: Graph) -> list[str]:
    """Non-constant float tensors: graph inputs and node outputs, in graph order."""
    names = [v.name for v in graph.inputs if v.dtype in FLOAT_TYPES]
    for node in graph.nodes:
        for out in node.outputs:
            value = graph.values.get(out) if out else None
            if value is not None and value.const is None and value.dtype in FLOAT_TYPES:
                names.append(out)
    return names


def default_backend() -> str:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "numpy"
    return "onnxruntime"


def observing_graph(graph: Graph, tensors: Sequence[str]) -> Graph:
    """``graph`` with ``tensors`` (and its own outputs) as its outputs."""
    names = list(dict.fromkeys([*graph.output_names, *tensors]))
    missing = [n for n in names if n not in graph.values]
    if missing:
        raise InputError(f"cannot observe {missing}: not values of graph {graph.name!r}")
    return graph.replace(outputs=[graph.values[n].typed_like() for n in names])


def run_batches(graph: Graph, tensors: Sequence[str], feeds: Iterable[dict[str, np.ndarray]], *,
                backend: str | None = None, progress: Steps | None = None, label: str = "calibrating",
                total: int | None = None):
    """Yield ``{tensor: array}`` for every batch of ``feeds`` (a float run of ``graph``).

    The generator owns its Session: it is closed when the feeds are exhausted or the generator
    is closed (``contextlib.closing`` where a consumer may stop early, as ``zip`` of two does).
    ``progress`` (``edgeinfer.progress.Steps``) is told one step counted in samples."""
    from edgeinfer.model import Model
    from edgeinfer.runtime.session import Session

    with Session(Model(observing_graph(graph, tensors)), backend=backend or default_backend()) as session, \
            steps(progress).step(label, total, unit="samples") as step:
        for batch in feeds:
            yield session.run(batch)
            step.advance()


def collect_histograms(graph: Graph, feeds: Iterable[dict[str, np.ndarray]], *,
                       tensors: Sequence[str] | None = None, backend: str | None = None,
                       bins: int = DEFAULT_BINS, progress: Steps | None = None,
                       total: int | None = None,
                       means: dict[str, ChannelMean] | None = None,
                       grids: dict[str, ValueGrid] | None = None) -> dict[str, TensorHistogram]:
    """One histogram per tensor (default: every float activation) over all ``feeds``; the
    ``ChannelMean`` accumulators of ``means`` and the ``ValueGrid`` ones of ``grids`` (tensor ->
    accumulator) are updated in the same run."""
    tensors = float_activations(graph) if tensors is None else list(tensors)
    histograms = {name: TensorHistogram(bins) for name in tensors}
    means, grids = means or {}, grids or {}
    observed = list(dict.fromkeys([*tensors, *means, *grids]))
    batches = 0
    with closing(run_batches(graph, observed, feeds, backend=backend, progress=progress, total=total)) as runs:
        for results in runs:
            for name in tensors:
                histograms[name].update(results[name])
            for accumulators in (means, grids):
                for name, accumulator in accumulators.items():
                    accumulator.update(results[name])
            batches += 1
    if batches == 0:
        raise InputError("calibration data is empty: expected at least one sample")
    return histograms
