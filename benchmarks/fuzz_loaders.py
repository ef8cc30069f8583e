"""Long fuzzing run of every model loader; records the crash count per loader.

    python benchmarks/fuzz_loaders.py --seconds 600                # 10 minutes per loader
    python benchmarks/fuzz_loaders.py --seconds 120 --kinds onnx,tflite --json fuzz.json

Each loader (``.eim``, ``.onnx``, ``.tflite``, ``.prototxt``, ``.caffemodel``, ``.pt``, ``.pt2``,
``.keras``; see ``tests/robustness/corpus.py``) is fed its valid seed file mutated in turn by
bit flips, byte overwrites, truncations, splices and random bytes, in-process, for
``--seconds``. An input that loads or raises an ``EdgeInferError`` is fine; any other
exception is a *crash* and one taking longer than ``--timeout`` seconds a *hang* (cut by
``signal.alarm``). Each distinct crash (exception type and the innermost edgeinfer frame) is
saved once under ``--save`` to replay; a crash of the interpreter itself ends the run and the
last input is in ``<save>/last_input*``. The JSON has, per loader: inputs tried, loaded,
refused, crashes, hangs, distinct crashes with an example each.

``tests/robustness/test_fuzz.py`` is the bounded version that runs in CI.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600, help="fuzzing time per loader")
    parser.add_argument("--kinds", default=",".join(corpus.available_kinds()),
                        help=f"loaders to fuzz (default: every available one of {', '.join(corpus.SEED_WRITERS)})")
    parser.add_argument("--timeout", type=int, default=60, help="seconds after which one input counts as a hang")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, default=Path("fuzz_crashes"), help="folder for crashing inputs")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    args.save.mkdir(parents=True, exist_ok=True)
    results = {}
    for kind in args.kinds.split(","):
        print(f"{kind}: fuzzing for {args.seconds:g} s", flush=True)
        results[kind] = fuzz_loader(kind, args.seconds, args.timeout, args.save, args.seed)
        r = results[kind]
        print(f"{kind}: {r['inputs']} inputs in {r['seconds']} s: {r['loaded']} loaded, {r['refused']} refused, "
              f"{r['crashes']} crashes ({len(r['distinct'])} distinct), {r['hangs']} hangs", flush=True)
    summary = {"seconds_per_loader": args.seconds, "seed": args.seed, "python": sys.version.split()[0],
               "loaders": results, "total_crashes": sum(r["crashes"] + r["hangs"] for r in results.values())}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.json}")
    return 1 if summary["total_crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
