"""Harness for Caffe converter tests: write a prototxt (and a caffemodel of random weights),
convert it with edgeinfer, run it, and run the same files through OpenCV's DNN module, an
independent Caffe implementation, as the oracle. The folder goes on ``sys.path`` so that test
modules can share net builders (``from test_nets import conv``) under ``--import-mode=importlib``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.converters import caffe
from edgeinfer.converters.caffe.prototxt import read_net
from edgeinfer.runtime.session import Session

# OpenCV computes in float32 with its own summation order (and im2col/winograd kernels);
# outputs of deep random nets agree to ~1e-5 relative, values near zero need an atol.
RTOL, ATOL = 1e-4, 1e-5
sys.path.insert(0, str(Path(__file__).parent))


class CaffeHarness:
    def __init__(self, folder: Path):
        self.folder = folder

    def write(self, text: str, name: str = "net", *, weights: bool = True, v1: bool = False,
              seed: int = 0) -> tuple[Path, Path | None]:
        prototxt = self.folder / f"{name}.prototxt"
        prototxt.write_text(text)
        if not weights:
            return prototxt, None
        caffemodel = self.folder / f"{name}.caffemodel"
        caffe.random_caffemodel(prototxt, caffemodel, seed=seed, v1=v1)
        return prototxt, caffemodel

    def convert(self, prototxt: Path, caffemodel: Path | None, **options) -> ei.Model:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", caffe.RandomWeightsWarning)
            return ei.convert(prototxt, weights=caffemodel, **options)

    def feeds(self, model: ei.Model, seed: int = 1, batch: int = 2) -> dict[str, np.ndarray]:
        """Random inputs; a symbolic dim (dynamic batch) gets size ``batch``."""
        rng = np.random.default_rng(seed)
        return {t.name: rng.standard_normal([d if isinstance(d, int) else batch for d in t.shape]).astype(np.float32)
                for t in model.inputs}

    def opencv(self, prototxt: Path, caffemodel: Path, feeds: dict[str, np.ndarray],
               blobs: list[str]) -> dict[str, np.ndarray]:
        """Run OpenCV; a blob is fetched by the name of the last layer that wrote it."""
        import cv2

        writer = {}
        for layer in read_net(prototxt).layers:
            for top in layer.tops:
                writer[top] = layer.name
        net = cv2.dnn.readNetFromCaffe(str(prototxt), str(caffemodel))
        for name, array in feeds.items():
            net.setInput(array, name)
        results = net.forward([writer[b] for b in blobs])
        return dict(zip(blobs, results, strict=True))

    def run(self, model: ei.Model, feeds: dict[str, np.ndarray], backend: str = "numpy") -> dict[str, np.ndarray]:
        return Session(model, backend=backend).run(feeds)

    def compare(self, text: str, name: str = "net", *, v1: bool = False, outputs: list[str] | None = None,
                rtol: float = RTOL, atol: float = ATOL, seed: int = 0, dynamic_batch: bool = False,
                batch: int = 2) -> ei.Model:
        """Convert and run ``text`` with random weights; assert edgeinfer matches OpenCV
        (with ``dynamic_batch``, on a batch of ``batch`` inputs)."""
        prototxt, caffemodel = self.write(text, name, v1=v1, seed=seed)
        model = self.convert(prototxt, caffemodel, outputs=outputs, dynamic_batch=dynamic_batch)
        feeds = self.feeds(model, batch=batch)
        got = self.run(model, feeds)
        blobs = [t.name for t in model.outputs]
        expected = self.opencv(prototxt, caffemodel, feeds, blobs)
        for blob in blobs:
            assert_close(got[blob], expected[blob], rtol=rtol, atol=atol, name=f"{name}:{blob}")
        return model


@pytest.fixture
def harness(tmp_path: Path) -> CaffeHarness:
    return CaffeHarness(tmp_path)
