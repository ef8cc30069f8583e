import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.errors import InputError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.quantize.data import (
    RandomCalibrationWarning,
    image_folder,
    iterate_feeds,
    npy_folder,
    open_source,
)


@pytest.fixture(scope="module")
def image_graph() -> Graph:
    return ei.convert(zoo.cnn_residual_depthwise(size=16), optimize=0).graph


def _two_inputs() -> Graph:
    return Graph([Node("Add", ["a", "b"], ["y"])], [Value("a", "float32", ("N", 3)), Value("b", "float32", ("N", 3))],
                 [Value("y", "float32", ("N", 3))], opset={"": 17})


def test_npy_folder_adds_batch_and_splits_to_the_model_batch(image_graph, tmp_path, rng):
    batch = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    single = rng.standard_normal((3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "a.npy", batch)
    np.save(tmp_path / "b.npy", single)
    feeds = list(npy_folder(tmp_path, image_graph))
    assert len(feeds) == 4
    assert_close(np.concatenate([f["input"] for f in feeds[:3]]), batch)
    assert_close(feeds[3]["input"], single[None])


def test_npz_files_feed_models_with_several_inputs(tmp_path, rng):
    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    np.savez(tmp_path / "s.npz", a=a, b=b)
    (feeds,) = list(open_source(tmp_path, _two_inputs()))
    assert_close(feeds["a"], a)
    assert_close(feeds["b"], b)
    np.save(tmp_path / "t.npy", a)
    with pytest.raises(InputError, match="npz"):
        list(npy_folder(tmp_path, _two_inputs()))


def test_image_folder_preprocesses_like_the_formula(image_graph, tmp_path, rng):
    import cv2

    pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "x.png"), pixels)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    (feeds,) = list(image_folder(tmp_path, image_graph, mean=mean, std=std))
    resized = cv2.resize(pixels, (16, 16), interpolation=cv2.INTER_AREA)[:, :, ::-1]  # BGR -> RGB
    expected = ((resized / 255.0 - np.array(mean)) / np.array(std)).transpose(2, 0, 1)[None]
    assert_close(feeds["input"], expected.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_random_data_only_when_asked_and_with_a_warning(image_graph):
    with pytest.raises(InputError, match="random"):
        open_source(None, image_graph)
    with pytest.warns(RandomCalibrationWarning):
        feeds = list(open_source(None, image_graph, random_samples=2))
    assert len(feeds) == 2 and feeds[0]["input"].shape == (1, 3, 16, 16)


def test_bad_samples_are_typed_errors(image_graph, tmp_path):
    with pytest.raises(InputError, match="rank"):
        list(iterate_feeds([np.zeros((2, 2), np.float32)], image_graph))
    with pytest.raises(InputError, match="dtype"):
        list(iterate_feeds([np.zeros((1, 3, 16, 16), np.int64)], image_graph))
    with pytest.raises(InputError, match="expected inputs"):
        list(iterate_feeds([{"other": np.zeros((1, 3, 16, 16), np.float32)}], image_graph))
    with pytest.raises(InputError, match="expected an existing directory"):
        open_source(tmp_path / "missing", image_graph)
    with pytest.raises(InputError, match="found none"):
        list(open_source(tmp_path, image_graph))
