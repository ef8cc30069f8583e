"""ONNX's own node test cases through the torch backend (CPU device), against ONNX's expected
outputs and the numpy backend's.

Every case of ``onnx.backend.test.case.node.collect_testcases()`` is converted with
``ei.convert``. A case with a node the torch backend declines (``supports`` gives a reason:
control flow, sequences, strings, element types torch has no kernels for) is skipped with
that reason, and ``test_declined_cases_are_the_documented_kinds`` checks the reasons are the
documented ones. Every other case compiles on torch alone and must match the expected outputs
(with the numpy conformance runner's comparison and tolerances) and the numpy backend. Cases
that torch accepts but computes differently are in ``EXCLUDED``, each with a ``BUG:`` or
``UNSUPPORTED:`` reason.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from edgeinfer.backends.numpy import NumpyBackend
from edgeinfer.backends.torch import TorchBackend

DEVICE = os.environ.get("EDGEINFER_TORCH_DEVICE", "cpu")  # gpu_check.sh: cuda:0


def _numpy_runner():
    """The numpy backend's conformance module: its case list, comparison and tolerances."""
    path = Path(__file__).parents[1] / "numpy" / "test_conformance.py"
    spec = importlib.util.spec_from_file_location("numpy_conformance", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


NUMPY = _numpy_runner()
MIN_ACCEPTED = 0.60  # share of all cases torch takes: 1161 of 1884 with onnx 1.23 (the rest are declined with a reason)

EXCLUDED: dict[str, str] = {}

# What a declined case's reason may say: the kinds of node the torch backend documents it leaves
# to other backends.
DECLINED_KINDS = ("has graph attributes", "no torch lowering", "which torch does not compute with",
                  "training-mode", "not lowered", "torch has 1-D, 2-D and 3-D", "torch pools 1-D")


@dataclass(frozen=True)
class Outcome:
    name: str
    declined: str | None
    error: str | None
    seconds: float


def _feeds(case, graph):
    names = [i.name for i in case.model.graph.input if i.name not in {t.name for t in case.model.graph.initializer}]
    return [dict(zip(names, map(NUMPY._as_array, inputs), strict=True)) for inputs, _ in case.data_sets]


def run_case(case) -> str | None:
    """Compare torch with the expected outputs and numpy; returns the decline reason, if any."""
    model = ei.convert(case.model)
    graph = model.graph
    declined = TorchBackend().unsupported(graph)
    if declined:
        label, reason = next(iter(declined.items()))
        return f"{label}: {reason}"
    torch_run = TorchBackend(device=DEVICE).compile(graph)
    numpy_run = NumpyBackend().compile(graph)
    output_names = [o.name for o in case.model.graph.output]
    rtol = case.rtol if case.name in NUMPY.ROUNDED_EXPECTATIONS else min(case.rtol, NUMPY.FP32_RTOL)
    for feeds, (_, outputs) in zip(_feeds(case, graph), case.data_sets, strict=True):
        got = torch_run.run(feeds)
        reference = numpy_run.run(feeds)
        for name, expected in zip(output_names, map(NUMPY._as_array, outputs), strict=True):
            NUMPY._compare(got[name], expected, rtol=rtol, atol=case.atol, name=f"{name} (expected)")
            NUMPY._compare(got[name], reference[name], rtol=rtol, atol=case.atol, name=f"{name} (numpy backend)")
    return None


def run_one(case) -> Outcome:
    start = time.perf_counter()
    declined = error = None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            declined = run_case(case)
        except Exception as exc:  # recorded, reported per case
            where = traceback.extract_tb(exc.__traceback__)[-1]
            error = f"{type(exc).__name__}: {str(exc).strip()[:400]} [{where.filename.split('/')[-1]}:{where.lineno}]"
    return Outcome(case.name, declined, error, time.perf_counter() - start)


@functools.cache
def outcomes() -> dict[str, Outcome]:
    return {case.name: run_one(case) for case in NUMPY.node_cases()}


def _params() -> list:
    return [pytest.param(case.name, marks=pytest.mark.xfail(reason=EXCLUDED[case.name], strict=True))
            if case.name in EXCLUDED else case.name for case in NUMPY.node_cases()]


def test_exclusion_reasons_are_well_formed():
    """Each entry names a real case and says ``BUG:`` or ``UNSUPPORTED:``, then what and why."""
    names = {case.name for case in NUMPY.node_cases()}
    malformed = {name: reason for name, reason in EXCLUDED.items()
                 if name not in names or not re.fullmatch(r"(BUG|UNSUPPORTED): .{10,}", reason, re.DOTALL)}
    assert not malformed, f"malformed EXCLUDED entries: {malformed}"


@pytest.mark.parametrize("name", _params())
def test_node_case(name: str):
    outcome = outcomes()[name]
    if outcome.declined is not None:
        pytest.skip(f"declined by the torch backend: {outcome.declined}")
    assert outcome.error is None, outcome.error


def test_declined_cases_are_the_documented_kinds():
    odd = {o.name: o.declined for o in outcomes().values()
           if o.declined is not None and not any(kind in o.declined for kind in DECLINED_KINDS)}
    assert not odd, f"cases declined for undocumented reasons: {dict(list(odd.items())[:10])}"


def test_torch_takes_most_cases():
    results = outcomes()
    accepted = sum(o.declined is None for o in results.values())
    assert accepted / len(results) >= MIN_ACCEPTED, f"torch accepts only {accepted}/{len(results)} cases"
