"""Precision as a measured decision: ``precision="fp32" | "auto" | "bf16" | "fp16"``.

fp32 is the reference. A reduced-precision configuration (OpenVINO's ``INFERENCE_PRECISION_HINT``
bf16/f16, torch computing in bf16) is a candidate of ``backend="auto"`` like an engine, with
three rules:

- **Offered only where it is native.** Each engine says which reduced precisions it computes
  on this CPU (its module's ``reduced_precisions(native)``), from the units ``/proc/cpuinfo``
  lists (``edgeinfer.machine``, as ``edgeinfer devices`` reports them: AVX512_BF16 or AMX-BF16
  for bf16 on x86, AVX512_FP16 or AMX-FP16 for fp16, the ``bf16``/``fphp`` features on ARM).
  A configuration the CPU would emulate is never compiled nor timed; the reason is reported.
- **Checked before it may win.** On real inputs (``samples=``, else the example feeds; random
  data alone checks nothing), every output is compared with the fp32 reference: its SQNR and
  its largest error relative to the output's range, against ``tolerance=`` (default: 30 dB and
  5% on every output, which keeps class scores and boxes). A candidate that fails is dropped
  with the figure that failed.
- **Mixed where one layer breaks it.** Where the engine can keep nodes in fp32
  (``keeps_fp32_nodes``: OpenVINO), the layers adding the most error are found as INT8's
  ``layer_noise`` finds them (every float tensor observed once at fp32 and once reduced, the
  noise each node adds over its inputs'), and kept fp32 with the nodes that feed them since the
  last convolution or matrix product, until the outputs hold (``mixed``).

What was chosen, each candidate's figures and why the others were not offered go into
``AutoChoice`` (the plan, ``edgeinfer run``/``bench``) and a compiled ``.eim``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from edgeinfer.errors import BackendError

PRECISIONS = ("fp32", "auto", "bf16", "fp16")
REDUCED = ("bf16", "fp16")
# engines with no reduced-precision configuration here, and why (the others say it themselves:
# their module's ``reduced_precisions``)
_NOT_OFFERED = {
    "onnxruntime": {"bf16": "onnxruntime's CPU kernels have no bf16 compute (a bf16 graph runs cast to fp32)",
                    "fp16": "onnxruntime's CPU fp16 kernels cover few ops (the rest run cast to fp32): emulated"},
    "tflite": {"bf16": "LiteRT has no bf16 compute",
               "fp16": "LiteRT's XNNPACK fp16 inference needs a delegate flag its Python interpreter does not expose"},
}
_COMPUTE = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "MatMulInteger", "ConvInteger"}
MIXED_ROUNDS = 4  # layers (with what feeds them) kept fp32 one after another before giving up


class Tolerance(NamedTuple):
    sqnr_db: float = 30.0  # every output's SQNR against fp32, at least
    max_error: float = 0.05  # every output's largest |error| over its fp32 range (max - min), at most


def tolerance_of(value: Any) -> Tolerance:
    """``tolerance=``: None (the default), a number (the SQNR floor in dB), a mapping with
    ``sqnr_db`` and/or ``max_error``, or a ``Tolerance``."""
    if value is None:
        return Tolerance()
    if isinstance(value, Tolerance):
        found = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        found = Tolerance(sqnr_db=float(value))
    elif isinstance(value, Mapping) and set(value) <= set(Tolerance._fields):
        found = Tolerance(**{k: float(v) for k, v in value.items()})
    else:
        raise BackendError(f"tolerance {value!r}: expected a number (the SQNR floor in dB) or "
                           f"{{'sqnr_db': 30, 'max_error': 0.05}}")
    if not (math.isfinite(found.sqnr_db) and math.isfinite(found.max_error)) or found.max_error < 0:
        raise BackendError(f"tolerance {value!r}: expected finite figures and max_error >= 0")
    return found


def check_precision(precision: Any) -> str:
    if precision is None:
        return "fp32"
    if precision not in PRECISIONS:
        raise BackendError(f"precision {precision!r}: expected one of {list(PRECISIONS)}")
    return precision


class OutputError(NamedTuple):
    sqnr_db: float
    max_error: float  # largest |error| over the output's fp32 range

    @property
    def lost(self) -> bool:
        """A shape, NaN or inf where fp32 has none, or an integer output changed: no figure."""
        return self.sqnr_db == -math.inf

    def as_json(self) -> dict[str, float | None]:
        """JSON holds no infinities: an exact output has ``sqnr_db`` None, a lost one both None."""
        if self.lost:
            return {"sqnr_db": None, "max_error": None}
        return {"sqnr_db": None if math.isinf(self.sqnr_db) else round(self.sqnr_db, 2),
                "max_error": round(self.max_error, 6)}

    def __str__(self) -> str:
        if self.lost:
            return "lost (NaN or inf where fp32 has none, another shape, or integers changed)"
        db = "exact" if math.isinf(self.sqnr_db) else f"{self.sqnr_db:.1f} dB"
        return f"{db}, max error {self.max_error:.2%} of range"


def output_errors(reference: Sequence[Mapping[str, Any]], outputs: Sequence[Mapping[str, Any]]) -> dict[str, OutputError]:
    """Per output, over all samples together: SQNR of ``outputs`` against ``reference`` and the
    largest absolute error over the reference's range. Non-float outputs must match exactly, as
    must the shapes and where the reference has NaN or inf (else -inf dB)."""
    return {name: _output_error([run[name] for run in reference], [run[name] for run in outputs])
            for name in reference[0]}


def _output_error(reference: Sequence[Any], outputs: Sequence[Any]) -> OutputError:
    signal = noise = worst = 0.0
    low, high = math.inf, -math.inf
    lost = OutputError(-math.inf, math.inf)
    for ref, got in zip(reference, outputs, strict=True):
        ref, got = np.asarray(ref), np.asarray(got)
        if ref.shape != got.shape:
            return lost
        a, b = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
        finite = np.isfinite(a)
        if not (np.array_equal(finite, np.isfinite(b)) and np.array_equal(a[~finite], b[~finite], equal_nan=True)):
            return lost  # NaN or inf where fp32 has none (fp16 ResNet-50 on OpenVINO: every class score NaN)
        a, b = a[finite], b[finite]  # the same NaN and inf in both
        if a.size == 0:
            continue
        diff = a - b
        signal, noise = signal + float(a @ a), noise + float(diff @ diff)
        worst = max(worst, float(np.max(np.abs(diff))))
        low, high = min(low, float(a.min())), max(high, float(a.max()))
    if not np.issubdtype(np.asarray(reference[0]).dtype, np.floating) and noise > 0:
        return lost
    db = math.inf if noise == 0 else 10.0 * math.log10(max(signal, 1e-30) / noise)
    span = high - low if high > low else max(abs(high), 1e-30)
    return OutputError(db, worst / span if worst else 0.0)


def failure(errors: Mapping[str, OutputError], tolerance: Tolerance) -> str | None:
    """The first output outside ``tolerance``, with its figure (None: every output holds)."""
    for name, error in errors.items():
        if error.lost:
            return f"output {name!r}: {error}"
        if error.sqnr_db < tolerance.sqnr_db:
            return f"output {name!r}: {error.sqnr_db:.1f} dB SQNR vs fp32 < {tolerance.sqnr_db:g} dB"
        if error.max_error > tolerance.max_error:
            return (f"output {name!r}: max error {error.max_error:.2%} of its range > "
                    f"{tolerance.max_error:.0%}")
    return None


def worst(errors: Mapping[str, OutputError]) -> str:
    """The figures of the output with the lowest SQNR, for one line of a report."""
    if not errors:
        return "no outputs"
    name = min(errors, key=lambda n: errors[n].sqnr_db)
    return f"worst output {name!r} {errors[name]}"


class Offer(NamedTuple):
    """A reduced-precision configuration of an engine, as its engine options."""

    backend: str  # as the candidate names it: "openvino", "torch@cuda:0"
    precision: str
    options: dict[str, Any]

    @property
    def engine(self) -> str:
        """The backend its engine options are keyed by ("torch" for "torch@cuda:0")."""
        return self.backend.partition("@")[0]


def native_precisions(flags: set[str] | None = None, architecture: str | None = None) -> dict[str, str | None]:
    """Per reduced precision, None where this CPU computes it natively, else why not."""
    import platform

    from edgeinfer.machine import cpu_flags, features

    architecture = (architecture or platform.machine()).lower()
    have = features(cpu_flags() if flags is None else flags, architecture)
    arm = architecture.startswith(("arm", "aarch"))
    needs = {"bf16": ("BF16",) if arm else ("BF16", "AMX-BF16"), "fp16": ("FP16",) if arm else ("FP16", "AMX-FP16")}
    return {precision: None if any(have.get(label) for label in labels) else
            f"this CPU has no {precision} units ({' or '.join(labels)} absent from /proc/cpuinfo): emulated, not timed"
            for precision, labels in needs.items()}


def offers(backends: Sequence[str], wanted: Sequence[str], native: Mapping[str, str | None] | None = None) -> \
        tuple[list[Offer], dict[str, str]]:
    """The reduced-precision configurations of ``backends`` in ``wanted`` this CPU computes
    natively, and ``{"engine[precision]": why not}`` for the others."""
    from edgeinfer.backend import backend_module

    native = native_precisions() if native is None else native
    found: list[Offer] = []
    refused: dict[str, str] = {}
    for name in dict.fromkeys(backends):
        base, _, where = name.partition("@")  # torch@cuda:0: the engine on an accelerator
        if base == "numpy" or where == "cpu":  # an engine pinned to the CPU is offered as itself
            continue
        module = backend_module(base)
        if where:  # the accelerator's own units decide, not the CPU's
            hook = getattr(module, "device_precisions", None)
            said = hook(where) if hook is not None else {
                p: f"{base} on {where} has no {p} configuration in edgeinfer" for p in wanted}
        else:
            hook = getattr(module, "reduced_precisions", None)
            said = hook(native) if hook is not None else _NOT_OFFERED.get(name, {})
        for precision in wanted:
            label = f"{name}[{precision}]"
            if not where and native.get(precision) is not None:
                refused[label] = f"not offered: {native[precision]}"
            elif precision not in said:
                refused[label] = f"not offered: {name} has no {precision} configuration in edgeinfer"
            elif isinstance(said[precision], str):
                refused[label] = f"not offered: {said[precision]}"
            else:
                found.append(Offer(name, precision, dict(said[precision])))
    return found, refused


def noisiest_nodes(graph: Any, run_observed: Callable[[Any, bool], list[dict[str, Any]]]) -> list[tuple[str, float]]:
    """The nodes of ``graph`` by the noise each adds over its inputs' (INT8's ``layer_noise``,
    for a reduced precision): ``run_observed(observing graph, reduced)`` runs the graph with
    every float tensor as an output, at fp32 (False) and reduced (True), on the samples.
    Returns ``[(node output name, added relative noise power)]``, most first."""
    from edgeinfer.quantize.calibrate import observing_graph

    floats = [name for name, value in graph.values.items() if value.dtype in ("float32", "float16", "float64")
              and graph.producer(name) is not None]
    observed = observing_graph(graph, floats)
    reference, reduced = run_observed(observed, False), run_observed(observed, True)
    errors = output_errors([{k: r[k] for k in floats} for r in reference],
                           [{k: r[k] for k in floats} for r in reduced])
    power = {name: 10.0 ** (-min(e.sqnr_db, 300.0) / 10.0) for name, e in errors.items()}
    added = []
    for node in graph.nodes:
        outs = [o for o in node.outputs if o in power]
        if not outs:
            continue
        before = max((power.get(i, 0.0) for i in node.inputs if i), default=0.0)
        added.append((outs[0], max(power[o] for o in outs) - before))
    return sorted(added, key=lambda item: -item[1])


def feeding_chain(graph: Any, output: str) -> list[str]:
    """The node writing ``output`` and the nodes feeding it back to the last convolution or
    matrix product on each path (included): what must stay fp32 for that node to see fp32
    inputs (a tensor rounded to bf16 before it is lost already). Output names of the nodes."""
    chain: list[str] = []
    stack = [graph.producer(output)]
    while stack:
        node = stack.pop()
        if node is None or node.outputs[0] in chain:
            continue
        chain.append(node.outputs[0])
        if node.op_type in _COMPUTE and len(chain) > 1:
            continue
        stack.extend(graph.producer(name) for name in node.inputs if name and name not in graph.initializers)
    return chain


def node_names(graph: Any, outputs: Sequence[str]) -> list[str]:
    """The nodes writing ``outputs``, by name (op type and output where unnamed), for reports."""
    named = []
    for out in outputs:
        node = graph.producer(out)
        named.append(f"{node.name or node.outputs[0]} ({node.op_type})" if node is not None else out)
    return named


def describe(record: Mapping[str, Any] | None) -> list[str]:
    """Lines for a precision record (``AutoChoice.precision_record``, a compiled ``.eim``'s):
    what the plan computes in, its figures against fp32, the nodes kept fp32, what was not
    offered. Nothing for plain fp32 with nothing to say."""
    if not record or (record.get("precision") == "fp32" and not record.get("not_offered")):
        return []
    error = record.get("error") or {}
    figures = "; ".join(f"{out} {_figures_text(e)}" for out, e in error.items()) or "not checked against fp32"
    lines = ["precision: fp32 (no reduced-precision configuration here is faster within the tolerance)"
             if record.get("precision") == "fp32" else f"precision: {record.get('precision')} ({figures})"]
    if record.get("kept_fp32"):
        lines.append(f"precision: kept fp32: {', '.join(record['kept_fp32'])}")
    lines += [f"precision: {label}: {why}" for label, why in (record.get("not_offered") or {}).items()]
    return lines


def _figures_text(error: Mapping[str, Any]) -> str:
    db, most = error.get("sqnr_db"), error.get("max_error", 0.0)
    if most is None:
        return str(OutputError(-math.inf, math.inf))
    return str(OutputError(math.inf if db is None else float(db), float(most)))
