"""Make ``digits_model`` (the trained digits CNN shared with benchmarks/bench_quantize.py)
importable: with ``--import-mode=importlib`` pytest puts no test folder on ``sys.path``."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from digits_model import DigitsTask, digits_task  # noqa: E402


@pytest.fixture(scope="session")
def digits() -> DigitsTask:
    """The digits CNN trained once per test session, with its train/test split."""
    return digits_task()
