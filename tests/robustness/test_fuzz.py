"""Property-based fuzzing of every loader: valid seed files mutated (bit flips, byte
overwrites, truncations, splices) and random bytes. Whatever the bytes, loading returns or
raises an ``EdgeInferError``; anything else (a crash of the process fails the whole run, a
hang is cut by ``signal.alarm``) is a bug. Bounded for CI by ``max_examples``; the long run is
``benchmarks/fuzz_loaders.py``."""

from __future__ import annotations

import signal
import warnings

import pytest
from corpus import LOADERS, MUTATIONS, mutate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer.errors import EdgeInferError

# examples per loader: the slow ones (torch, Keras) get fewer
EXAMPLES = {"eim": 500, "onnx": 500, "tflite": 500, "prototxt": 400, "caffemodel": 300, "pt": 100, "pt2": 150,
            "keras": 200}
SECONDS_PER_EXAMPLE = 60  # a hang guard, far above any example's time


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"one load took more than {SECONDS_PER_EXAMPLE} s")


def load_or_refuse(kind: str, path) -> None:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS_PER_EXAMPLE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            LOADERS[kind](path)
    except EdgeInferError:
        pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_loader_survives_mutated_files(kind, seeds, tmp_path_factory):
    data = seeds.data(kind)
    folder = tmp_path_factory.mktemp(f"fuzz_{kind}")

    @settings(max_examples=EXAMPLES[kind], deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(mutation=st.sampled_from(sorted(MUTATIONS)), seed=st.integers(0, 2**32 - 1), count=st.integers(1, 16))
    def survives(mutation, seed, count):
        load_or_refuse(kind, seeds.place(kind, mutate(data, mutation, seed, count), folder))

    survives()


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_loader_survives_arbitrary_bytes(kind, seeds, tmp_path_factory):
    seeds.path(kind)  # skips when the loader's framework is missing
    folder = tmp_path_factory.mktemp(f"bytes_{kind}")

    @settings(max_examples=max(EXAMPLES[kind] // 4, 10), deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(data=st.binary(max_size=2048))
    def survives(data):
        load_or_refuse(kind, seeds.place(kind, data, folder))

    survives()
