"""ONNX node conformance of the numpy backend: pass/fail/excluded counts, pass rate, and the
failures grouped by op.

Usage: ``python benchmarks/onnx_conformance.py [-v] [-k SUBSTRING]``. The runner is the one
in ``tests/backends/numpy/test_conformance.py`` (imported by path), so this report and the
test suite cannot disagree.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections import defaultdict
from pathlib import Path

TEST_MODULE = Path(__file__).resolve().parents[1] / "tests" / "backends" / "numpy" / "test_conformance.py"


def load_runner():
    spec = importlib.util.spec_from_file_location("edgeinfer_conformance", TEST_MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="print every failure's error")
    parser.add_argument("-k", default="", help="only cases whose name contains this substring")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    runner = load_runner()  # collects the cases (the test module parametrizes over them)
    cases = [c for c in runner.node_cases() if args.k in c.name]
    collected = time.perf_counter()
    results = [runner.run_one(case) for case in cases]
    finished = time.perf_counter()

    passed = [r for r in results if r.passed]
    excluded = [r for r in results if r.excluded is not None]
    failed = [r for r in results if r.error is not None and r.excluded is None]
    fixed = [r for r in excluded if r.error is None]
    by_op: dict[str, list] = defaultdict(list)
    for r in failed:
        by_op["+".join(r.ops) or "?"].append(r)

    print(f"ONNX node conformance, numpy backend: {len(cases)} cases "
          f"(collect {collected - start:.1f} s, run {finished - collected:.1f} s)")
    print(f"  passed   {len(passed):5d}")
    print(f"  failed   {len(failed):5d}")
    print(f"  excluded {len(excluded):5d}" + (f"  ({len(fixed)} of them pass now)" if fixed else ""))
    if cases:
        print(f"  pass rate {len(passed) / len(cases):.1%}  (excluded count as not passing)")
    if fixed:
        print("\nexcluded but passing now (remove from EXCLUDED): " + ", ".join(r.name for r in fixed))
    if failed:
        print("\nfailures by op:")
        for op, rows in sorted(by_op.items(), key=lambda item: (-len(item[1]), item[0])):
            print(f"  {op:32s} {len(rows):4d}  e.g. {rows[0].name}: {rows[0].error[:160]}")
            if args.verbose:
                for r in rows:
                    print(f"      {r.name}: {r.error}")
    fallback: dict[str, int] = defaultdict(int)
    for r in results:
        for op in r.fallback_ops:
            fallback[op] += 1
    if fallback:
        print("\nops run by the onnx.reference fallback (cases using each): "
              + ", ".join(f"{op} {n}" for op, n in sorted(fallback.items(), key=lambda item: -item[1])))
    slowest = sorted(results, key=lambda r: r.seconds, reverse=True)[:5]
    print("\nslowest cases: " + ", ".join(f"{r.name} {r.seconds * 1e3:.0f} ms" for r in slowest))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
