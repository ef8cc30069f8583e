"""ONNX's own node test cases, run through the numpy backend on the user's path.

Every case of ``onnx.backend.test.case.node.collect_testcases()`` is converted with
``ei.convert`` and run with ``ei.Session(..., backend="numpy")``; outputs are compared with
``assert_close`` (dtype must match exactly; integers, strings and bools exactly; fp32/fp64 at
rtol 1e-5 or the case's own tolerance where that is stricter; fp16/bf16 at the per-dtype
tolerance of ``devkit.testing``; float8/float4 within less than one rounding step). Every case runs once per test session:
``outcomes()`` caches the result of each, the parametrized tests report them one by one and
``test_pass_rate`` checks the acceptance criterion over all of them.

``benchmarks/onnx_conformance.py`` imports this module by path and uses the same runner.
"""

from __future__ import annotations

import functools
import time
import traceback
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import DEFAULT_TOLERANCES, assert_close

MIN_PASS_RATE = 0.90
FP32_RTOL = 1e-5  # stricter than ONNX's own runner (1e-3): the numpy backend is the reference
NARROW_RTOL = 1e-2  # float8/float4 rounding errors (>= 2**-4 relative) fail

# Cases whose expected outputs ONNX's generator hard-codes rounded to 4 decimals: compared at the
# case's own tolerance (rtol 1e-3) instead of FP32_RTOL.
ROUNDED_EXPECTATIONS = {
    "test_roialign_aligned_false", "test_roialign_aligned_true", "test_gridsample_bicubic",
    "test_averagepool_2d_ceil_last_window_starts_on_pad",
}

_RANDOM = ("UNSUPPORTED: random sampling; the expected values are one draw of numpy's generator, which "
           "the spec does not require a backend to reproduce")

# case name -> reason. Every reason starts with "BUG:" (a known defect, what is wrong and whose
# code it is in) or "UNSUPPORTED:" (deliberately not supported, and why).
EXCLUDED: dict[str, str] = {
    **{name: _RANDOM for name in (
        "test_bernoulli", "test_bernoulli_double", "test_bernoulli_seed", "test_bernoulli_expanded",
        "test_bernoulli_double_expanded", "test_bernoulli_seed_expanded")},
    **{name: ("UNSUPPORTED: training-mode BatchNormalization (batch statistics and running-mean outputs); "
              "the nn kernels are inference only") for name in (
        "test_batchnorm_example_training_mode", "test_batchnorm_epsilon_training_mode")},
}


@functools.cache
def node_cases() -> tuple:
    """All ONNX node test cases (collected once; their generators warn about inf/nan)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def _compare(got, expected, *, rtol: float, atol: float, name: str) -> None:
    if expected is None:
        if got is not None:
            raise AssertionError(f"{name}: expected an empty optional, got {type(got).__name__}")
        return
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            found = f"list of {len(got)}" if isinstance(got, list) else type(got).__name__
            raise AssertionError(f"{name}: expected a sequence of {len(expected)} tensors, got {found}")
        for index, (g, e) in enumerate(zip(got, expected, strict=True)):
            _compare(g, e, rtol=rtol, atol=atol, name=f"{name}[{index}]")
        return
    expected = np.asarray(expected)
    if not isinstance(got, np.ndarray):
        raise AssertionError(f"{name}: expected a tensor, got {type(got).__name__}")
    if expected.dtype.kind in "OUS":
        if got.dtype.kind not in "OUS":
            raise AssertionError(f"{name}: expected strings, got dtype {got.dtype}")
        assert_close(got.astype(object), expected.astype(object), name=name)
    elif got.dtype != expected.dtype:
        raise AssertionError(f"{name}: dtype {got.dtype} != expected {expected.dtype}")
    elif expected.dtype.kind in "iub":
        assert_close(got, expected, name=name)
    elif expected.dtype in (np.float32, np.float64, np.complex64, np.complex128):
        assert_close(got, expected, rtol=rtol, atol=atol, name=name)
    elif expected.dtype.name in ("float16", "bfloat16"):
        # the expected values round every intermediate to half precision, kernels that compute in
        # float32 and round once differ by a few half-precision ulps: the per-dtype tolerance
        half_rtol, half_atol = DEFAULT_TOLERANCES[expected.dtype.name]
        assert_close(got.astype(np.float32), expected.astype(np.float32), rtol=max(rtol, half_rtol),
                     atol=max(atol, half_atol), name=name)
    else:  # float8, float4, int4, int2: one rounding step of these types is a real error
        assert_close(got.astype(np.float32), expected.astype(np.float32), rtol=NARROW_RTOL, atol=0.0,
                     name=name)


def _as_array(item):
    """Case data may hold ``TensorProto``s (types numpy cannot spell, such as float8)."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(item) if isinstance(item, TensorProto) else item


def run_case(case) -> tuple[str, ...]:
    """Run one node test case through ``convert`` + ``Session``; raise on any mismatch.
    Returns the ops that ran on the onnx.reference fallback."""
    model = ei.convert(case.model)
    session = ei.Session(model, backend="numpy")
    input_names = [i.name for i in case.model.graph.input
                   if i.name not in {t.name for t in case.model.graph.initializer}]
    output_names = [o.name for o in case.model.graph.output]
    rtol = case.rtol if case.name in ROUNDED_EXPECTATIONS else min(case.rtol, FP32_RTOL)
    for inputs, outputs in case.data_sets:
        feeds = dict(zip(input_names, map(_as_array, inputs), strict=True))
        results = session.run(feeds)
        for name, expected in zip(output_names, map(_as_array, outputs), strict=True):
            _compare(results[name], expected, rtol=rtol, atol=case.atol, name=name)
    stats = session.stats()
    return tuple(dict.fromkeys(op for part in stats.get("parts", [stats]) for op in part.get("fallback_ops", {})))


@dataclass(frozen=True)
class Outcome:
    name: str
    ops: tuple[str, ...]
    error: str | None  # None: passed
    excluded: str | None
    seconds: float
    fallback_ops: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.error is None and self.excluded is None


def _ops_of(case) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.op_type for n in case.model.graph.node))


def run_one(case) -> Outcome:
    start = time.perf_counter()
    error, fallback = None, ()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            fallback = run_case(case)
        except Exception as exc:  # recorded, reported per case
            where = traceback.extract_tb(exc.__traceback__)[-1]
            error = f"{type(exc).__name__}: {str(exc).strip()[:400]} [{where.filename.split('/')[-1]}:{where.lineno}]"
    return Outcome(case.name, _ops_of(case), error, EXCLUDED.get(case.name), time.perf_counter() - start,
                   fallback)


@functools.cache
def outcomes() -> dict[str, Outcome]:
    """Run every case once; case name -> Outcome."""
    return {case.name: run_one(case) for case in node_cases()}


def _case_names() -> list[str]:
    return [case.name for case in node_cases()]


def _params() -> list:
    return [pytest.param(name, marks=pytest.mark.xfail(reason=EXCLUDED[name], strict=False))
            if name in EXCLUDED else name for name in _case_names()]


def test_exclusion_reasons_are_well_formed():
    names = set(_case_names())
    for name, reason in EXCLUDED.items():
        assert name in names, f"EXCLUDED names an unknown case {name!r}"
        assert reason.startswith(("BUG:", "UNSUPPORTED:")), f"{name}: reason must start with BUG: or UNSUPPORTED:"
        assert len(reason.split(":", 1)[1].strip()) > 10, f"{name}: the reason must say what and why"


@pytest.mark.parametrize("name", _params())
def test_node_case(name: str):
    outcome = outcomes()[name]
    assert outcome.error is None, outcome.error


def test_pass_rate():
    results = outcomes()
    passed = sum(o.passed for o in results.values())
    rate = passed / len(results)
    assert rate >= MIN_PASS_RATE, (f"conformance pass rate {rate:.1%} ({passed}/{len(results)}) is below "
                                   f"{MIN_PASS_RATE:.0%}")


# Control flow and the sequence/optional ops it carries run on native kernels (bodies compiled
# once by the numpy executor), never on the onnx.reference fallback.
NATIVE_CONTROL_FLOW = frozenset({
    "If", "Loop", "Scan", "SequenceMap", "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceAt",
    "SequenceErase", "SequenceLength", "ConcatFromSequence", "SplitToSequence", "Optional", "OptionalHasElement",
    "OptionalGetElement"})


def _ops_in(graph) -> set[str]:
    """Op types of a GraphProto and of all its subgraphs."""
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                ops |= _ops_in(sub)
    return ops


@functools.cache
def _control_flow_cases() -> dict[str, set[str]]:
    """Case name -> its ops, for the cases that use control flow, sequence or optional ops."""
    ops = {case.name: _ops_in(case.model.graph) for case in node_cases()}
    return {name: used for name, used in ops.items() if used & NATIVE_CONTROL_FLOW}


def test_control_flow_cases_cover_the_ops():
    """ONNX has no node case for ConcatFromSequence or SequenceErase (test_control_flow.py covers them)."""
    covered = set().union(*_control_flow_cases().values())
    missing = NATIVE_CONTROL_FLOW - covered
    assert missing <= {"ConcatFromSequence", "SequenceErase"}, f"no conformance case uses {sorted(missing)}"


@pytest.mark.parametrize("name", list(_control_flow_cases()))
def test_control_flow_case_runs_natively(name: str):
    from edgeinfer.backends.numpy import NumpyBackend

    outcome = outcomes()[name]
    assert outcome.passed, outcome.error or f"excluded: {outcome.excluded}"
    case = next(c for c in node_cases() if c.name == name)
    fallback = NumpyBackend().compile(ei.convert(case.model).graph).fallback_ops
    assert not set(fallback) & NATIVE_CONTROL_FLOW, f"ran on the onnx.reference fallback: {fallback}"
