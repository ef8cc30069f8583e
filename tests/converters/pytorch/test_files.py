"""PyTorch files: ExportedProgram (.pt2) and TorchScript are converted; pickles are refused
without being unpickled; archives that loading would execute are refused."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from pytorch_checks import assert_outputs_close, eager, run_numpy
from pytorch_zoo import ZOO

import edgeinfer as ei
from edgeinfer.converters import pytorch as frontend
from edgeinfer.errors import ConversionError, ModelFormatError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@functools.cache
def lenet() -> torch.nn.Module:
    return ZOO["lenet"].model()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pytorch_files")
    module, example = lenet(), ZOO["lenet"].inputs(2)
    paths = {name: folder / name for name in ("model.pt2", "dynamic.pt2", "scripted.pt", "traced.pth",
                                              "module.pt", "state.pth", "legacy.pt")}
    torch.export.save(torch.export.export(module, example), paths["model.pt2"])
    batch = torch.export.Dim("batch", min=1)
    torch.export.save(torch.export.export(module, example, dynamic_shapes=({0: batch},)), paths["dynamic.pt2"])
    torch.jit.save(torch.jit.script(module), paths["scripted.pt"])
    torch.jit.save(torch.jit.trace(module, example), paths["traced.pth"])
    torch.save(module, paths["module.pt"])
    torch.save(module.state_dict(), paths["state.pth"])
    torch.save(module.state_dict(), paths["legacy.pt"], _use_new_zipfile_serialization=False)
    return paths


def check_lenet(model: ei.Model, batch: int) -> None:
    inputs = ZOO["lenet"].inputs(batch)
    assert_outputs_close(run_numpy(model, inputs), eager(lenet(), inputs), f"lenet batch {batch}")


def test_accepts_paths_and_objects_without_importing_torch() -> None:
    code = ("import sys; from edgeinfer.converters import pytorch as p; "
            "assert p.accepts('m.pt2') and p.accepts('m.PT') and p.accepts('m.pth') and not p.accepts('m.onnx'); "
            "assert not p.accepts(object()); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert frontend.accepts(lenet()) and frontend.accepts(torch.jit.script(lenet()))


def test_exported_program_file(saved) -> None:
    model = ei.convert(saved["model.pt2"], input_names=["image"])
    assert [t.name for t in model.inputs] == ["image"] and model.inputs[0].shape == (2, 1, 28, 28)
    assert model.metadata["source_file"] == "model.pt2"
    check_lenet(model, 2)


def test_exported_program_file_with_dynamic_batch(saved) -> None:
    model = ei.convert(saved["dynamic.pt2"])
    assert model.inputs[0].shape[0] == "N"
    check_lenet(model, 1)
    check_lenet(model, 5)


def test_static_exported_program_is_reexported_for_a_dynamic_batch() -> None:
    entry = ZOO["mlp"]
    module = entry.model()
    model = ei.convert(torch.export.export(module, entry.inputs(2)), dynamic_batch=True)
    assert model.inputs[0].shape == ("N", 12)
    for batch in (1, 3):
        inputs = entry.inputs(batch)
        assert_outputs_close(run_numpy(model, inputs), eager(module, inputs), f"mlp batch {batch}")


def test_static_exported_program_file_with_dynamic_batch(saved) -> None:
    model = ei.convert(saved["model.pt2"], dynamic_batch=True)
    assert model.inputs[0].shape == ("N", 1, 28, 28)
    check_lenet(model, 1)
    check_lenet(model, 3)


class FixedBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(2, 12) * 2.0


def test_static_exported_program_with_a_baked_batch_says_how_to_reexport() -> None:
    program = torch.export.export(FixedBatch(), (torch.randn(2, 3, 4),))
    with pytest.raises(ConversionError, match=r"static batch and its graph depends on it.*Dim\('batch'\)"):
        ei.convert(program, dynamic_batch=True)


def test_exported_program_refuses_other_shapes(saved) -> None:
    with pytest.raises(ConversionError, match=r"fixes its input shapes to \[\(2, 1, 28, 28\)\]"):
        ei.convert(saved["model.pt2"], input_shapes={"x": (1, 1, 32, 32)})


@pytest.mark.parametrize("name", ["scripted.pt", "traced.pth"])
def test_torchscript_file_with_input_shape(saved, name: str) -> None:
    model = ei.convert(saved[name], input_shapes={"input": (1, 1, 28, 28)}, dynamic_batch=True)
    assert [t.name for t in model.inputs] == ["input"] and model.inputs[0].shape == ("N", 1, 28, 28)
    check_lenet(model, 1)
    check_lenet(model, 4)


def test_torchscript_without_shapes_asks_for_input_shape(saved) -> None:
    with pytest.raises(ConversionError, match=r"--input-shape NAME:1x3x224x224.*\['x'\]"):
        ei.convert(saved["scripted.pt"])


def test_torchscript_module_in_memory() -> None:
    model = ei.convert(torch.jit.script(lenet()), example_inputs=ZOO["lenet"].inputs(2))
    assert model.inputs[0].name == "x"
    check_lenet(model, 2)


@pytest.mark.parametrize("name, says", [
    ("module.pt", r"pickled Python object .*class pytorch_zoo\.LeNet"),
    ("state.pth", r"state dict .*weights_only=True"),
    ("legacy.pt", r"plain pickle"),
])
def test_pickles_are_refused_without_unpickling(saved, name: str, says: str, monkeypatch) -> None:
    def no_unpickling(*args, **kwargs):
        raise AssertionError("the converter tried to unpickle a file")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(ModelFormatError, match=says) as info:
        ei.convert(saved[name])
    assert "torch.export.save" in str(info.value) and "torch.jit.save" in str(info.value)


def rewrite_archive(source: Path, target: Path, change) -> Path:
    """Copy a zip archive, passing each member's (name, bytes) through ``change``."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            result = change(info.filename, old.read(info.filename))
            if result is not None:
                new.writestr(info.filename, result[1]) if result[0] == info.filename else new.writestr(*result)
    return target


def test_pt2_with_a_pickled_weight_is_refused(saved, tmp_path) -> None:
    def mark_pickled(name: str, data: bytes):
        if name.endswith("model_weights_config.json"):
            config = json.loads(data)
            next(iter(config["config"].values()))["use_pickle"] = True
            return name, json.dumps(config).encode()
        return name, data

    path = rewrite_archive(saved["model.pt2"], tmp_path / "pickled.pt2", mark_pickled)
    with pytest.raises(ModelFormatError, match="pickled tensor"):
        ei.convert(path)


def test_pt2_with_compiled_code_is_refused(saved, tmp_path) -> None:
    def add_library(name: str, data: bytes):
        return name, data

    path = rewrite_archive(saved["model.pt2"], tmp_path / "aoti.pt2", add_library)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("model/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(ModelFormatError, match="compiled code"):
        ei.convert(path)


def test_pt2_with_unsafe_sample_inputs_is_refused(saved, tmp_path) -> None:
    class Payload:
        def __reduce__(self):
            return (os.getcwd, ())

    def replace_samples(name: str, data: bytes):
        if "sample_inputs" in name:
            import io
            import pickle

            buffer = io.BytesIO()
            pickle.dump(Payload(), buffer)
            return name, buffer.getvalue()
        return name, data

    path = rewrite_archive(saved["model.pt2"], tmp_path / "samples.pt2", replace_samples)
    with pytest.raises(ModelFormatError, match="sample inputs"):
        ei.convert(path)


@pytest.mark.parametrize("content, says", [
    (b"", "empty file"),
    (b"not a model at all", "neither a zip file nor a pickle"),
])
def test_bad_files(tmp_path, content: bytes, says: str) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match=says):
        ei.convert(path)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ModelFormatError, match="no such file"):
        ei.convert(tmp_path / "absent.pt2")


def test_unknown_zip_is_refused(tmp_path) -> None:
    path = tmp_path / "other.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("other/readme.txt", "hello")
    with pytest.raises(ModelFormatError, match="neither TorchScript"):
        ei.convert(path)


def test_truncated_pt2_is_refused(saved, tmp_path) -> None:
    path = tmp_path / "truncated.pt2"
    shutil.copy(saved["model.pt2"], path)
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    with pytest.raises(ModelFormatError):
        ei.convert(path)


def test_cli_converts_pt2_and_torchscript_files(saved, tmp_path) -> None:
    """`edgeinfer convert model.pt2 -o model.eim` and TorchScript with --input-shape/--dynamic-batch."""
    import numpy as np
    from click.testing import CliRunner

    from edgeinfer.cli import main

    runner = CliRunner()
    pt2_eim, ts_eim = tmp_path / "pt2.eim", tmp_path / "ts.eim"
    result = runner.invoke(main, ["convert", str(saved["dynamic.pt2"]), "-o", str(pt2_eim)])
    assert result.exit_code == 0, result.output
    check_lenet(ei.load(pt2_eim), 3)
    result = runner.invoke(main, ["convert", str(saved["scripted.pt"]), "-o", str(ts_eim),
                                  "--input-shape", "input:1x1x28x28", "--dynamic-batch"])
    assert result.exit_code == 0, result.output
    loaded = ei.load(ts_eim)
    assert loaded.inputs[0].shape == ("N", 1, 28, 28)
    check_lenet(loaded, 5)
    x = np.asarray(ZOO["lenet"].inputs(2)[0], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    result = runner.invoke(main, ["run", str(ts_eim), "--input", f"input={tmp_path / 'x.npy'}", "--repeat", "1"])
    assert result.exit_code == 0 and "latency" in result.output, result.output
    result = runner.invoke(main, ["convert", str(saved["scripted.pt"]), "-o", str(tmp_path / "bad.eim")])
    assert result.exit_code == 2 and "--input-shape" in result.output
    assert not (tmp_path / "bad.eim").exists()
    result = runner.invoke(main, ["convert", str(saved["module.pt"]), "-o", str(tmp_path / "bad.eim")])
    assert result.exit_code == 2 and "torch.export.save" in result.output
