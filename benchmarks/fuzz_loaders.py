"""Long fuzzing run of every model loader; records the crash count per loader.

    python benchmarks/fuzz_loaders.py --seconds 600                # 10 minutes per loader
    python benchmarks/fuzz_loaders.py --seconds 120 --kinds onnx,tflite --json fuzz.json

Each loader (``.eim``, ``.onnx``, ``.tflite``, ``.prototxt``, ``.caffemodel``, ``.pt``, ``.pt2``,
``.keras``; see ``tests/robustness/corpus.py``) is fed its valid seed file mutated in turn by
bit flips, byte overwrites, truncations, splices and random bytes, in-process, for
``--seconds``. An input that loads or raises an ``EdgeInferError`` is fine; any other
exception is a *crash* and one taking longer than ``--timeout`` seconds a *hang* (cut by
``signal.alarm``). Each distinct crash (exception type and the innermost edgeinfer frame) is
saved once under ``--save`` to replay. Each loader runs in a child process: a crash of the
interpreter itself (a segmentation fault in a framework's C++ loader) is counted as a
*process crash*, its input kept, and fuzzing resumes in a new child. The JSON has, per loader: inputs tried, loaded,
refused, crashes, hangs, process crashes, distinct crashes with an example each.

``tests/robustness/test_fuzz.py`` is the bounded version that runs in CI.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository root: devkit/ is not installed
sys.path.insert(0, str(ROOT / "tests" / "robustness"))

import corpus  # noqa: E402

from edgeinfer.errors import EdgeInferError  # noqa: E402


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def _signature(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "edgeinfer" in f.filename
              or "/converters/" in f.filename or "/backends/" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def fuzz_loader(kind: str, seconds: float, timeout: int, save: Path, seed: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"fuzz_{kind}_"))
    seed_path = corpus.write_seed(kind, work / "seed")
    data = seed_path.read_bytes()
    folder = work / "case"
    folder.mkdir()
    if kind == "caffemodel":
        (folder / "tiny.prototxt").write_bytes(seed_path.with_suffix(".prototxt").read_bytes())
    target = folder / seed_path.name
    rng = random.Random(seed)
    mutations = sorted(corpus.MUTATIONS)
    counts = {"inputs": 0, "loaded": 0, "refused": 0, "crashes": 0, "hangs": 0}
    distinct: dict[str, dict] = {}
    signal.signal(signal.SIGALRM, _alarm)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        mutation = mutations[counts["inputs"] % len(mutations)]
        raw = corpus.mutate(data, mutation, rng.getrandbits(32), rng.randint(1, 16))
        target.write_bytes(raw)
        (save / f"last_input{seed_path.suffix}").write_bytes(raw)
        counts["inputs"] += 1
        signal.alarm(timeout)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                corpus.LOADERS[kind](target)
            counts["loaded"] += 1
        except EdgeInferError:
            counts["refused"] += 1
        except Hang:
            counts["hangs"] += 1
            _record(distinct, "hang", raw, kind, seed_path.suffix, save, f"over {timeout} s")
        except BaseException as exc:  # the property under test: nothing else escapes
            if isinstance(exc, KeyboardInterrupt):
                raise
            counts["crashes"] += 1
            _record(distinct, _signature(exc), raw, kind, seed_path.suffix, save, f"{exc}"[:300])
        finally:
            signal.alarm(0)
    counts["seconds"] = round(time.monotonic() - started, 1)
    counts["distinct"] = distinct
    return counts


def _record(distinct: dict, signature: str, raw: bytes, kind: str, suffix: str, save: Path, message: str) -> None:
    if signature in distinct:
        distinct[signature]["count"] += 1
        return
    path = save / f"{kind}_{len(distinct)}{suffix}"
    path.write_bytes(raw)
    distinct[signature] = {"count": 1, "example": str(path), "message": message}
    print(f"  {kind}: new crash {signature}: {message[:120]} -> {path}", flush=True)


def fuzz_isolated(kind: str, args: argparse.Namespace) -> dict:
    """Fuzz ``kind`` in child processes: a crash of the interpreter (a segmentation fault in a
    framework's C++ loader) is counted, its input saved, and fuzzing goes on in a new child."""
    remaining, attempt = args.seconds, 0
    merged = {"inputs": 0, "loaded": 0, "refused": 0, "crashes": 0, "hangs": 0, "process_crashes": 0,
              "seconds": 0.0, "distinct": {}}
    suffix = corpus.SEED_WRITERS[kind][0]
    while remaining >= 1:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            started = time.monotonic()
            done = subprocess.run([sys.executable, __file__, "--worker", kind, "--seconds", str(remaining),
                                   "--timeout", str(args.timeout), "--seed", str(args.seed + attempt),
                                   "--save", str(args.save), "--json", out.name])
            elapsed = time.monotonic() - started
            text = Path(out.name).read_text()
        if done.returncode in (0, 1) and text:
            result = json.loads(text)["loaders"][kind]
            for key in ("inputs", "loaded", "refused", "crashes", "hangs", "seconds"):
                merged[key] += result[key]
            merged["distinct"].update(result["distinct"])
            break
        merged["process_crashes"] += 1
        merged["seconds"] += round(elapsed, 1)
        kept = args.save / f"{kind}_process_crash_{merged['process_crashes']}{suffix}"
        shutil.copy(args.save / f"last_input{suffix}", kept)
        print(f"  {kind}: the process died (status {done.returncode}); input saved as {kept}", flush=True)
        merged["distinct"][f"process crash (status {done.returncode}) #{merged['process_crashes']}"] = {
            "count": 1, "example": str(kept), "message": f"exit status {done.returncode}"}
        remaining -= elapsed
        attempt += 1
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600, help="fuzzing time per loader")
    parser.add_argument("--kinds", default=",".join(corpus.available_kinds()),
                        help=f"loaders to fuzz (default: every available one of {', '.join(corpus.SEED_WRITERS)})")
    parser.add_argument("--timeout", type=int, default=60, help="seconds after which one input counts as a hang")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, default=Path("fuzz_crashes"), help="folder for crashing inputs")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--worker", metavar="KIND", help=argparse.SUPPRESS)  # one loader, in this process
    args = parser.parse_args(argv)
    args.save.mkdir(parents=True, exist_ok=True)
    results = {}
    for kind in [args.worker] if args.worker else args.kinds.split(","):
        if not args.worker:
            print(f"{kind}: fuzzing for {args.seconds:g} s", flush=True)
        if args.worker:
            results[kind] = fuzz_loader(kind, args.seconds, args.timeout, args.save, args.seed)
            continue
        results[kind] = r = fuzz_isolated(kind, args)
        print(f"{kind}: {r['inputs']} inputs in {r['seconds']:.1f} s: {r['loaded']} loaded, {r['refused']} refused, "
              f"{r['crashes']} crashes, {r['process_crashes']} process crashes ({len(r['distinct'])} distinct), "
              f"{r['hangs']} hangs", flush=True)
    summary = {"seconds_per_loader": args.seconds, "seed": args.seed, "python": sys.version.split()[0],
               "loaders": results,
               "total_crashes": sum(r["crashes"] + r["hangs"] + r.get("process_crashes", 0) for r in results.values())}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
        if not args.worker:
            print(f"wrote {args.json}")
    return 1 if summary["total_crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
