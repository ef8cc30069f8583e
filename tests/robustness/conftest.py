"""Shared fixtures for the robustness tests: valid seed files of every kind (built once per
session, see ``corpus.py``), a way to place a (mutated) copy of one in a fresh folder, and the
CLI checker. The folder goes on ``sys.path`` so that test modules share ``corpus``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import corpus  # noqa: E402


class Seeds:
    """Valid files of every available kind, and copies of them (changed or not) to break."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._paths: dict[str, Path] = {}

    def path(self, kind: str) -> Path:
        if kind not in self._paths:
            _, _, needs = corpus.SEED_WRITERS[kind]
            if needs is not None and not corpus.has(needs.split(".")[0]):
                pytest.skip(f"{needs} is not installed")
            self._paths[kind] = corpus.write_seed(kind, self.folder / kind)
        return self._paths[kind]

    def data(self, kind: str) -> bytes:
        return self.path(kind).read_bytes()

    def place(self, kind: str, data: bytes, folder: Path, name: str | None = None) -> Path:
        """``data`` as a file of ``kind`` in ``folder`` (a caffemodel gets the seed's prototxt beside it)."""
        seed = self.path(kind)
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "caffemodel":
            shutil.copy(seed.with_suffix(".prototxt"), folder / "tiny.prototxt")
        target = folder / (name or seed.name)
        target.write_bytes(data)
        return target


@pytest.fixture(scope="session")
def seeds(tmp_path_factory) -> Seeds:
    return Seeds(tmp_path_factory.mktemp("seeds"))
