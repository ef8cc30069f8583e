"""Every script in ``benchmarks/`` starts as its docstring says to run it: from the repository
root of a checkout, with the project's interpreter and nothing added to ``PYTHONPATH``
(``fuzz_loaders.py`` once stopped at its first import, as ``devkit/`` is not installed).
``--help`` parses the arguments after every import the script makes at the top, so this
catches a broken import or argument parser without measuring anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_every_benchmark_script_is_listed():
    assert "bench_runtime.py" in SCRIPTS and "fuzz_loaders.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_script_starts_from_the_repository_root(script: str):
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=ROOT, env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script} --help exited {done.returncode}: {done.stderr.strip()[-800:]}"
    assert "usage:" in done.stdout, f"{script} --help printed no usage: {done.stdout[:300]!r}"


def test_gpu_check_prints_its_usage():
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--help"], cwd=ROOT, env=_clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--device cpu --quick" in done.stdout
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--bogus"], cwd=ROOT, env=_clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown argument --bogus" in done.stderr
