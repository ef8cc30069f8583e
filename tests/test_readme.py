"""The README's command lines work as written.

Every ``edgeinfer ...`` line of the fenced bash blocks in the README's "Quick start" and
"Command line" sections runs here, in a folder where the file names the README uses exist:
``model.onnx`` is the shipped ``models/sample_cnn.onnx``, ``deploy.prototxt``/``net.caffemodel``
the shipped Caffe LeNet, ``x.npy`` the shipped sample input, ``calib_npy_dir/`` and ``images/``
a few random calibration samples; files a line writes (``model.eim``) feed the lines after it.
Optional parts (``[--report]``) and comments are left out. A line that needs a model file that
is not shipped is listed in ``ILLUSTRATIVE`` with the reason; any other line that fails, or a
new line that matches neither, fails this test, so the README cannot drift from the tool.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgeinfer.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTIONS = ("Quick start", "Command line")
# substrings of README lines that cannot run on shipped models -> why
ILLUSTRATIVE = {
    "convert model.pt2": "needs a PyTorch ExportedProgram file (the PyTorch front end is tested in tests/converters)",
    "convert saved_model_dir": "needs a TensorFlow SavedModel (the TensorFlow front end is tested in tests/converters)",
    "input=photo.jpg": "needs a photo (images as inputs are tested in tests/test_cli.py)",
    "--delegate": "needs a TFLite delegate library for an accelerator (--delegate is tested in tests/test_cli.py)",
}
MAKE_TARGETS = ("make demo", "make test")  # checked to be Makefile targets; running them is CI's job


def readme_commands() -> list[str]:
    """The command lines of the fenced bash blocks in SECTIONS, continuations joined, comments dropped."""
    text = README.read_text()
    commands = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        if title.strip() not in SECTIONS:
            continue
        for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    commands.append(line)
    return commands


def without_optional_parts(line: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]", "", line).strip()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    shutil.copy(ROOT / "models" / "sample_cnn.onnx", folder / "model.onnx")
    shutil.copy(ROOT / "models" / "sample_input.npy", folder / "x.npy")
    shutil.copy(ROOT / "models" / "caffe_lenet_digits" / "lenet_digits.prototxt", folder / "deploy.prototxt")
    shutil.copy(ROOT / "models" / "caffe_lenet_digits" / "lenet_digits.caffemodel", folder / "net.caffemodel")
    sample = np.load(folder / "x.npy")
    rng = np.random.default_rng(0)
    (folder / "calib_npy_dir").mkdir()
    (folder / "images").mkdir()
    for index in range(4):
        np.save(folder / "calib_npy_dir" / f"{index}.npy", rng.standard_normal(sample.shape).astype(np.float32))
        image = rng.integers(0, 256, (sample.shape[2], sample.shape[3], 3), dtype=np.uint8)
        import matplotlib.image

        matplotlib.image.imsave(folder / "images" / f"{index}.png", image)
    return folder


def test_readme_has_command_lines_and_make_targets_exist():
    commands = readme_commands()
    assert any(c.startswith("edgeinfer ") for c in commands)
    makefile = (ROOT / "Makefile").read_text()
    for line in commands:
        if line.startswith("make "):
            target = line.split()[1]
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"README runs `{line}`: no such target"


def test_readme_command_lines_run(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    ran, skipped = [], []
    for line in readme_commands():
        if line in MAKE_TARGETS or line.startswith("make "):
            continue
        assert line.startswith("edgeinfer "), f"README line is neither edgeinfer nor make: {line!r}"
        reason = next((why for key, why in ILLUSTRATIVE.items() if key in line), None)
        if reason is not None:
            skipped.append((line, reason))
            continue
        args = shlex.split(without_optional_parts(line))[1:]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, f"README line failed: {line}\n{result.output}"
        ran.append(line)
    assert len(ran) >= len(skipped), (ran, skipped)
    assert (workdir / "model.eim").is_file() and (workdir / "model.tflite").is_file()
