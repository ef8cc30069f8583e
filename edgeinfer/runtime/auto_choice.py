"""What ``backend="auto"`` decided (``AutoChoice``) and the rule it decides by (``decide``):
the fastest candidate, except that the native engine is kept within ``NATIVE_MARGIN``."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.model import Model

_TIME_BUDGET_S = 2.0  # timing rounds for all candidates together, after compile
_DROP_FACTOR = 3.0
_PROBE_FACTOR = 2.0  # one timed call each: a candidate over 2x the best is not timed further
_CLOSE = 1.05  # two candidates within 5% are timed again before one is chosen
# another candidate must be this much faster than the native engine on the whole graph. 5% was
# within the noise of 2 threads on 2 shared cores: in a full bench_real run auto took OpenVINO
# over LiteRT on MediaPipe hand_landmark_full, then ran 1.06x (fastest calls 1.15x) the original
# file; a rerun kept LiteRT at 1.00x.
NATIVE_MARGIN = 0.10
NATIVE_ENGINES = {"tflite": "tflite", "onnx": "onnxruntime", "pytorch": "torch"}  # source_format -> backend
RULE = "native-kept-within-10%"  # how the winner is picked; in the cache key, so older choices are measured again


@dataclass
class AutoChoice:
    backends: list[str]  # the winning priority list
    median_ms: dict[str, float] = field(default_factory=dict)  # candidate -> median latency
    skipped: dict[str, str] = field(default_factory=dict)  # candidate -> why it was not timed
    cached: bool = False
    key: str = ""
    native: str | None = None  # the candidate that is the native engine on the whole graph, if one ran
    native_note: str = ""  # why the native engine is no whole-graph candidate, where it is not
    reason: str = ""  # why the winner won (fastest, or the native engine kept within the margin)
    repartitions: dict[str, list[str]] = field(default_factory=dict)  # candidate -> what moved off an engine, why
    precision: str = "fp32"  # the winner's compute precision (auto_precision)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # the winner's engine options over the session's
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)  # reduced candidate -> output -> figures vs fp32
    precision_notes: dict[str, str] = field(default_factory=dict)  # configuration -> not offered, dropped or slower: why
    kept_fp32: dict[str, list[str]] = field(default_factory=dict)  # mixed candidate -> the nodes kept fp32
    # the winner as measured (backends, plan, sequential runner), so Session need not compile it again
    prepared: tuple[Any, Any, Any] | None = field(default=None, repr=False)

    def describe(self) -> str:
        """The winner and why, then every candidate with its median (the native one marked) or
        why it was not timed."""
        winner = self.label  # openvino[bf16],numpy for a reduced precision
        lines = [f"auto: {winner}" + (" (cached)" if self.cached else "") + (f": {self.reason}" if self.reason else "")]
        if self.native_note:
            lines.append(f"  native engine: {self.native_note}")
        for label, ms in sorted(self.median_ms.items(), key=lambda item: item[1]):
            marks = [m for m, on in (("native engine, whole graph", label == self.native),
                                     ("chosen", label == winner)) if on]
            lines.append(f"  {label}: {ms:.3g} ms" + (f" ({'; '.join(marks)})" if marks else ""))
        lines += [f"  {label}: not timed: {why}" for label, why in self.skipped.items()]
        lines += [f"  {label}: re-partitioned: {note}" for label, notes in self.repartitions.items() for note in notes]
        lines += [f"  {label}: vs fp32: " + "; ".join(f"{out} {_figures(e)}" for out, e in errors.items())
                  for label, errors in self.errors.items()]
        lines += [f"  {label}: kept fp32: {', '.join(nodes)}" for label, nodes in self.kept_fp32.items()]
        lines += [f"  {label}: {why}" for label, why in self.precision_notes.items()]
        return "\n".join(lines)

    def precision_record(self) -> dict[str, Any]:
        """The precision decision as a compiled ``.eim`` and ``edgeinfer run`` report it."""
        label = ",".join(self.backends) if self.precision == "fp32" else self.label
        return {"precision": self.precision, "engine_options": self.options,
                "error": {out: _figures(e, text=False) for out, e in self.errors.get(label, {}).items()},
                "kept_fp32": self.kept_fp32.get(label, []), "not_offered": dict(self.precision_notes)}

    @property
    def label(self) -> str:
        """The winner as the candidates are labelled (``openvino[bf16],numpy``)."""
        from edgeinfer.runtime.auto_precision import Candidate

        return Candidate(self.backends, self.options, self.precision).label


def _figures(error: Any, text: bool = True) -> Any:
    """An output's figures against fp32, from an ``OutputError`` or its JSON form (the cache)."""
    from edgeinfer.runtime.precision import _figures_text

    if isinstance(error, dict):
        return _figures_text(error) if text else error
    return str(error) if text else error.as_json()


def native_engine(model: Model) -> str | None:
    """The backend that runs the model's source format natively (None: unknown or none)."""
    return NATIVE_ENGINES.get(model.metadata.get("source_format", ""))


def decide(medians: Mapping[str, float], native: str | None = None,
           margin: float = NATIVE_MARGIN) -> tuple[str, str]:
    """The winner of ``medians`` (candidate -> median, one set of interleaved blocks) and why:
    the fastest, except that ``native`` (the native engine on the whole graph) is kept unless
    the fastest is more than ``margin`` faster than it."""
    fastest = min(medians, key=medians.get)
    if native is None or native not in medians or native == fastest:
        why = "the native engine, fastest" if native == fastest else "fastest"
        return fastest, why
    ratio = medians[native] / medians[fastest] if medians[fastest] > 0 else float("inf")
    if ratio > 1 + margin:
        return fastest, (f"fastest, {ratio:.2f}x faster than the native engine {native} "
                         f"(over the {margin:.0%} margin)")
    return native, (f"the native engine, kept: {fastest} is only {ratio:.3f}x faster "
                    f"(within the {margin:.0%} margin)")


def decisive(times: Mapping[str, Sequence[float]], native: str | None) -> tuple[str, ...] | None:
    """The candidates to time again before deciding (``times``: label -> seconds per call, in
    ``timing.time_engines``'s rounds): those whose ratio to the native engine may lie either side
    of the bar ``1 + NATIVE_MARGIN``, with the native engine; without one, the two leaders if
    they may lie either side of each other. Not only the fastest: should it start too slowly, the
    next one over the bar is chosen (``aot_compile._runner_up``), and under load that comparison
    flipped DenseNet-121's choice (TFLite 8.7-16.5% faster than onnxruntime from run to run).
    "May": the medians' ratio is within 5% of the bar (``_CLOSE``), or the bar lies within the
    middle half of the ratios of the rounds' own medians (the timing noise, wider under load)."""
    medians = {label: statistics.median(samples) for label, samples in times.items()}
    ranked = sorted(medians, key=medians.get)
    if len(ranked) < 2 or ranked[0] == native:
        return None
    if native not in medians:
        return (ranked[0], ranked[1]) if _straddles(times, ranked[0], ranked[1], 1.0) else None
    near = tuple(label for label in ranked if medians[label] < medians[native]
                 and _straddles(times, label, native, 1 + NATIVE_MARGIN))
    return (*near, native) if near else None


def _straddles(times: Mapping[str, Sequence[float]], fast: str, slow: str, bar: float) -> bool:
    """Whether ``slow``'s time over ``fast``'s may be either side of ``bar`` (``decisive``)."""
    ratio = statistics.median(times[slow]) / max(statistics.median(times[fast]), 1e-12)
    if bar / _CLOSE <= ratio < bar * _CLOSE:
        return True
    rounds = [statistics.median(s) / max(statistics.median(f), 1e-12)
              for s, f in zip(_rounds(times[slow]), _rounds(times[fast]), strict=False)]
    if len(rounds) < 4:
        return False
    quartiles = statistics.quantiles(rounds, n=4)
    return quartiles[0] <= bar <= quartiles[2]


def _rounds(samples: Sequence[float]) -> list[Sequence[float]]:
    """``samples`` cut into ``timing.time_engines``'s blocks, one per round."""
    from edgeinfer.timing import ENGINE_BLOCK

    return [samples[i:i + ENGINE_BLOCK] for i in range(0, len(samples) - ENGINE_BLOCK + 1, ENGINE_BLOCK)]
