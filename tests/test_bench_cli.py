"""``edgeinfer bench``: latency, memory, profiles, raw-engine peers, JSON, plot, streams, errors."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.cli import bench, main, peers
from edgeinfer.cli.memory import PeakRSS
from edgeinfer.errors import BackendError, InputError


@pytest.fixture
def onnx_file(tmp_path, mlp_model):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model, path)
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_bench_json_has_every_figure_consistent_with_its_samples(tmp_path, onnx_file):
    out = tmp_path / "r.json"
    result = invoke("bench", onnx_file, "--backend", "numpy,onnxruntime", "--runs", 6, "--warmup", 1,
                    "--json", out, "--quiet")
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert {"machine", "settings", "latency", "peer_ratios"} <= set(document)
    assert document["machine"]["versions"]["onnxruntime"]
    by_name = {r["backend"]: r for r in document["latency"]}
    assert set(by_name) == {"numpy", "onnxruntime"}
    for report in by_name.values():
        samples = np.array(report["samples_ms"])
        assert len(samples) == 6
        assert report["ms"]["min"] == pytest.approx(samples.min())
        assert report["ms"]["median"] == pytest.approx(np.median(samples))
        assert report["ms"]["p99"] == pytest.approx(np.percentile(samples, 99))
        assert report["ms"]["max"] == pytest.approx(samples.max())
        assert report["throughput"] == pytest.approx(1000 / np.median(samples))
        assert report["peak_rss_bytes"] >= 0 and report["memory_method"]
    # the numpy profile times every node of the converted model, once
    labels = {row["label"] for row in by_name["numpy"]["profile"]["rows"]}
    assert labels == {node.label for node in ei.convert(onnx_file).graph.nodes}
    assert by_name["onnxruntime"]["profile"] is None  # one engine part: no per-op times
    assert "wrote" not in result.output  # --quiet


def test_bench_prints_tables_profile_and_peers_and_writes_a_png(tmp_path, onnx_file):
    png, out = tmp_path / "b.png", tmp_path / "b.json"
    result = invoke("bench", onnx_file, "--backend", "numpy,onnxruntime", "--runs", 4, "--warmup", 1, "--peers",
                    "--top", 3, "--plot", png, "--json", out)
    assert result.exit_code == 0, result.output
    assert "median ms" in result.output and "peak RSS MiB" in result.output
    nodes = len(ei.convert(onnx_file).graph.nodes)
    assert f"numpy: slowest 3 ops of {nodes}" in result.output
    assert "raw onnxruntime (original file)" in result.output and f"wrote {png}" in result.output
    document = json.loads(out.read_text())
    raw = {r["backend"]: r for r in document["latency"] if r["peer"]}
    # the user's own file, not an export, once: as the native baseline, not again as a peer
    assert raw["raw onnxruntime (original file)"]["runs_on"] == str(onnx_file)
    assert raw["raw onnxruntime (original file)"]["native"] and "raw onnxruntime" not in raw
    medians = {r["backend"]: r["ms"]["median"] for r in document["latency"]}
    for ours, row in document["peer_ratios"].items():
        for peer, ratio in row.items():
            assert ratio == pytest.approx(medians[ours] / medians[peer])
    installed = {f"raw {name}" for name in peers.PEERS if peers.PEERS[name].installed()}
    assert set(raw) | {f"raw {name}" for name in document["skipped_peers"]} == \
        (installed - {"raw onnxruntime"}) | {"raw onnxruntime (original file)"} | \
        {f"raw {name}" for name in document["skipped_peers"]}
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_bench_json_to_stdout_is_the_whole_output(onnx_file):
    result = CliRunner().invoke(main, ["bench", str(onnx_file), "--runs", "2", "--warmup", "0", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [r["backend"] for r in document["latency"]] == ["numpy", "onnxruntime"]


@pytest.mark.parametrize("name", sorted(peers.PEERS))
def test_each_installed_peer_computes_what_edgeinfer_computes(name, mlp_model):
    model = ei.convert(mlp_model)
    feeds = model.random_feeds(batch=3)
    try:
        runner, runs_on = peers.prepare(name, model, threads=1)
    except peers.PeerUnavailable as exc:
        pytest.skip(str(exc))
    assert runs_on == f"exported .{peers.PEERS[name].reads}"
    got = runner(feeds)
    got = list(got.values()) if isinstance(got, dict) else got
    expected = ei.Session(model).run(feeds)["y"]
    assert_close(np.asarray(got[0]).reshape(expected.shape), expected, rtol=1e-4, atol=1e-6)  # engines' fp32 order


def test_unknown_or_missing_peer_is_a_typed_reason(mlp_model, monkeypatch):
    model = ei.convert(mlp_model)
    with pytest.raises(peers.PeerUnavailable, match="unknown peer 'tensorrt'"):
        peers.prepare("tensorrt", model, threads=1)
    fake = peers.Peer("ghost", "onnx", "no_such_engine_module", lambda data, threads: None)
    monkeypatch.setitem(peers.PEERS, "ghost", fake)
    with pytest.raises(peers.PeerUnavailable, match="'no_such_engine_module' is not installed"):
        peers.prepare("ghost", model, threads=1)


def test_a_peer_that_cannot_run_is_skipped_with_its_reason(onnx_file, monkeypatch):
    fake = peers.Peer("ghost", "onnx", "no_such_engine_module", lambda data, threads: None)
    monkeypatch.setitem(peers.PEERS, "ghost", fake)
    result = invoke("bench", onnx_file, "--backend", "onnxruntime", "--runs", 2, "--peers", "--top", 0)
    assert result.exit_code == 0, result.output
    assert "ghost: module 'no_such_engine_module' is not installed" in result.output


def test_peak_rss_sees_an_allocation_inside_the_block():
    size = 64 * 1024 * 1024
    with PeakRSS() as peak:
        block = np.ones(size // 8)  # touched, so resident
        del block
    assert peak.increase >= 0.9 * size, (peak.method, peak.increase)


def test_peak_rss_sampler_when_the_kernel_mark_cannot_be_reset(monkeypatch):
    from edgeinfer.cli import memory

    monkeypatch.setattr(memory, "_reset_high_water_mark", lambda: False)
    size = 64 * 1024 * 1024
    with PeakRSS() as peak:
        block = np.ones(size // 8)
        deadline = time.monotonic() + 10  # wait for the sampler to see it, however slow the machine
        while peak.peak - peak.baseline < 0.9 * size and time.monotonic() < deadline:
            time.sleep(0.005)
        del block
    assert peak.method.startswith("RSS sampled")
    assert peak.increase >= 0.9 * size


def test_part_profile_times_every_part_of_a_multi_part_plan():
    model = ei.convert(zoo.inception_net(size=16, blocks=1, width=8, classes=5))
    feeds = model.random_feeds()
    with ei.Session(model, backend="onnxruntime", executor="dag") as session:
        assert len(session.plan.parts) > 1
        profile = bench.profile_session(session, feeds, runs=2)
    assert profile.kind == "part" and len(profile.rows) == len(session.plan.parts)
    assert profile.total_ms == pytest.approx(sum(row.ms for row in profile.rows))
    assert all(row.op == "onnxruntime" for row in profile.rows)


def test_stream_executor_must_be_local_or_ray(mlp_model):
    model = ei.convert(mlp_model)
    with pytest.raises(InputError, match="expected one of local, ray"):
        bench.stream(model, "numpy", model.random_feeds(), threads=1, requests=2, stages=1, executor="mpi")


def test_bench_stream_on_ray_error_is_one_line(onnx_file, monkeypatch):
    original = ei.Session.__init__

    def refuse_ray(self, *args, executor="sequential", **kwargs):
        if executor == "ray":
            raise BackendError("executor 'ray' needs Ray: pip install 'edgeinfer[ray]'")
        original(self, *args, executor=executor, **kwargs)

    monkeypatch.setattr(ei.Session, "__init__", refuse_ray)
    result = invoke("bench", onnx_file, "--backend", "numpy", "--runs", 2, "--top", 0, "--stream", 4,
                    "--stages", 1, "--executor", "ray")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "error: executor 'ray' needs Ray: pip install 'edgeinfer[ray]'"


@pytest.mark.parametrize("args, message", [
    (["--plot", "{tmp}/b.jpg"], "ending in .png"),
    (["--stages", "0", "--stream", "3"], "--stages '0'"),
    (["--backend", ","], "at least one backend"),
    (["--backend", "tpu"], "unknown backend"),
])
def test_bench_bad_options_are_one_line_errors(tmp_path, onnx_file, args, message):
    result = invoke("bench", onnx_file, "--runs", 1, *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_progress_bar_goes_to_stderr_only_for_a_terminal(onnx_file, monkeypatch):
    import sys

    from edgeinfer.cli import progress

    assert not progress.shows_progress(quiet=False)  # pytest's stderr is not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert progress.shows_progress(quiet=False) and not progress.shows_progress(quiet=True)
    monkeypatch.setattr(progress, "shows_progress", lambda quiet=False: not quiet)
    result = CliRunner().invoke(main, ["bench", str(onnx_file), "--runs", "4", "--warmup", "0", "--json", "-"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # the bar never reaches stdout
    result = CliRunner().invoke(main, ["bench", str(onnx_file), "--runs", "4", "--warmup", "0"])
    assert result.exit_code == 0 and "median ms" in result.stdout


def test_bench_converts_a_caffe_model_with_its_weights_first():
    from pathlib import Path

    lenet = Path(__file__).resolve().parents[1] / "models" / "caffe_lenet_digits"
    result = invoke("bench", lenet / "lenet_digits.prototxt", "--weights", lenet / "lenet_digits.caffemodel",
                    "--backend", "onnxruntime", "--runs", 2, "--warmup", 0, "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    model = ei.convert(lenet / "lenet_digits.prototxt", weights=lenet / "lenet_digits.caffemodel")
    assert document["settings"]["feeds"] == {i.name: list(i.shape) for i in model.inputs}
    missing = invoke("bench", lenet / "lenet_digits.prototxt", "--weights", lenet / "absent.caffemodel")
    assert missing.exit_code == 2 and "--weights" in missing.output and "no such file" in missing.output


def test_isolated_memory_is_measured_in_a_fresh_process_per_contender(tmp_path, onnx_file):
    out = tmp_path / "r.json"
    result = invoke("bench", onnx_file, "--backend", "onnxruntime", "--peers", "--runs", 2, "--warmup", 0,
                    "--top", 0, "--memory", "isolated", "--json", out, "--quiet")
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["settings"]["memory"] == "isolated"
    for report in document["latency"]:
        assert report["memory_method"].endswith("in a fresh process")
        assert report["peak_rss_bytes"] > 0  # a fresh process loads the engine itself


def test_isolated_memory_failure_is_a_backend_error(mlp_model):
    model = ei.convert(mlp_model)
    with pytest.raises(BackendError, match="memory of nosuchengine in a fresh process failed"):
        bench.isolated_peak_rss(model, model.random_feeds(), backend="nosuchengine", peer=None, threads=1, warmup=0)


def test_a_backend_that_cannot_compile_is_timed_where_its_nodes_went_and_says_so(tmp_path, onnx_file, monkeypatch):
    from edgeinfer.backend import get_backend

    def refuse(self, graph, options):
        raise BackendError("onnxruntime could not compile graph 'g': simulated engine failure")

    monkeypatch.setattr(type(get_backend("onnxruntime")), "compile", refuse)
    out = tmp_path / "r.json"
    result = invoke("bench", onnx_file, "--backend", "numpy,onnxruntime", "--runs", 4, "--warmup", 0,
                    "--top", 0, "--json", out)
    assert result.exit_code == 0, result.output
    nodes = len(ei.convert(onnx_file).graph.nodes)
    # the runtime moves the refused nodes to numpy; bench says so rather than call it onnxruntime's time
    assert f"onnxruntime: {nodes} on numpy of its {nodes} nodes" in result.output
    by_name = {r["backend"]: r for r in json.loads(out.read_text())["latency"]}
    assert by_name["onnxruntime"]["elsewhere"] == {"numpy": nodes} and by_name["numpy"]["elsewhere"] == {}


def test_a_failing_backend_gets_a_row_saying_why_and_the_others_are_timed(tmp_path, onnx_file, monkeypatch):
    original = ei.Session.__init__

    def refuse(self, model, *args, backend="numpy", **kwargs):
        if backend == "onnxruntime":
            raise BackendError("onnxruntime could not compile graph 'g': simulated engine failure")
        original(self, model, *args, backend=backend, **kwargs)

    monkeypatch.setattr(ei.Session, "__init__", refuse)
    out = tmp_path / "r.json"
    result = invoke("bench", onnx_file, "--backend", "numpy,onnxruntime", "--runs", 4, "--warmup", 0,
                    "--top", 0, "--json", out)
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│")}
    assert "failed" in rows["onnxruntime"] and "best" in rows["numpy"]
    assert "onnxruntime failed: onnxruntime could not compile graph 'g': simulated engine failure" in result.output
    document = json.loads(out.read_text())
    assert [r["backend"] for r in document["latency"]] == ["numpy"]
    assert document["failed"] == {"onnxruntime": "onnxruntime could not compile graph 'g': simulated engine failure"}
    # every contender failing is an error, one line
    result = invoke("bench", onnx_file, "--backend", "onnxruntime", "--runs", 2, "--top", 0)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "error: every contender failed: onnxruntime: onnxruntime could not compile graph 'g': simulated engine failure"]


def test_a_misspelt_backend_is_an_error_before_anything_runs(onnx_file):
    result = invoke("bench", onnx_file, "--backend", "numpy,onnxrutime", "--runs", 2)
    assert result.exit_code == 2
    from edgeinfer.backend import available_backends

    assert result.output.strip().splitlines() == [
        f"error: unknown backend 'onnxrutime': expected one of {', '.join(available_backends())} or auto"]


def test_the_compact_table_fits_80_columns_and_the_full_one_has_every_column(onnx_file):
    from rich.console import Console

    from edgeinfer.cli import tables

    model = ei.convert(onnx_file)
    reports = bench.latency(model, ["numpy", "onnxruntime", ["openvino", "onnxruntime"]],
                            model.random_feeds(), threads=1, runs=2, warmup=0, peers=["onnxruntime", "openvino"],
                            source=onnx_file, profile=False)
    assert [r.backend for r in reports if r.native] == ["raw onnxruntime (original file)"]
    failed = {"tflite": "a reason"}
    for width, headings in ((80, (*tables.COMPACT, "original")), (180, (*tables.COLUMNS, tables.VS_NATIVE))):
        console = Console(width=width, record=True, color_system=None)
        console.print(tables.latency_table(reports, failed, width=console.width))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width
        assert "…" not in text
        rows = [cells[0] for cells in (line.replace("│", " ").split() for line in text.splitlines()) if cells]
        assert {"numpy", "onnxruntime", "openvino+onnxruntime", "raw", "tflite"} <= set(rows), text
        for heading in headings:
            assert heading in text
        assert ("first ms" in text) == (width == 180)
        assert "(original" in text  # the baseline's row, folded in the compact table


# -- the original file on its native engine (issue 22) -------------------------------------------
def _bench_json(tmp_path, model_path, *args):
    out = tmp_path / "native.json"
    result = invoke("bench", model_path, "--runs", 3, "--warmup", 1, "--top", 0, "--peers", "--json", out, *args)
    assert result.exit_code == 0, result.output
    return result.output, json.loads(out.read_text())


def _check_baseline(output: str, document: dict, label: str, runs_on, expected: list, got: dict) -> None:
    """The baseline's row is in the table and the JSON, timed like every contender; each edgeinfer
    contender's ratio is its median over the baseline's, and its reported output error is the one
    computed here from ``expected`` (the native engine, run by the test) and ``got`` (edgeinfer)."""
    rows = [line for line in output.splitlines() if line.startswith("│")]
    assert any(line.split("│")[1].strip() == label for line in rows), output
    assert "vs original" in output and f"{label}: {runs_on}" in output
    reports = {r["backend"]: r for r in document["latency"]}
    base = reports[label]
    assert base["native"] and base["peer"] and base["runs_on"] == str(runs_on)
    assert len(base["samples_ms"]) == 3  # timed in the same interleaved rounds as the others
    native = document["native"]
    assert native["label"] == label and native["runs_on"] == str(runs_on)
    ours = [r for r in document["latency"] if not r["peer"]]
    assert ours and set(native["ratios"]) == set(native["outputs"]) == {r["backend"] for r in ours}
    for report in ours:
        ratio = report["ms"]["median"] / base["ms"]["median"]
        assert native["ratios"][report["backend"]] == pytest.approx(ratio)
        assert report["vs_native"] == pytest.approx(ratio)
        assert document["peer_ratios"][report["backend"]][label] == pytest.approx(ratio)
        check = native["outputs"][report["backend"]]
        assert check == report["native_check"] and check["within_tolerance"], check
        errors = [float(np.max(np.abs(np.asarray(got[name], np.float64) - np.asarray(want, np.float64))))
                  for name, want in expected]
        tolerances = [bench.NATIVE_RTOL * float(np.max(np.abs(want))) + bench.NATIVE_ATOL for _, want in expected]
        # bench's sessions and engines may use other thread counts than the test's: other fp32
        # summation orders, so the errors agree to within a tenth of the tolerance, not exactly
        index = [name for name, _ in expected].index(check["output"])
        assert check["tolerance"] == pytest.approx(tolerances[index])
        assert check["max_abs_error"] == pytest.approx(errors[index], abs=0.1 * tolerances[index])
        assert check["max_abs_error"] / tolerances[index] >= max(np.divide(errors, tolerances)) - 0.1
        assert all(e <= t for e, t in zip(errors, tolerances, strict=True))


def test_bench_peers_times_a_real_tflite_on_litert_as_the_baseline(tmp_path):
    from ai_edge_litert import interpreter as litert

    from tests.real.corpus import image_input, model_file

    source = model_file("mediapipe", "mediapipe/modules/face_detection/face_detection_short_range.tflite")
    photo = image_input("china", 128, 128, mean=127.5, std=127.5, layout="NHWC")
    np.save(tmp_path / "photo.npy", photo)
    output, document = _bench_json(tmp_path, source, "--backend", "numpy", "-i", f"input={tmp_path / 'photo.npy'}")
    engine = litert.Interpreter(model_path=str(source))
    engine.allocate_tensors()
    engine.set_tensor(engine.get_input_details()[0]["index"], photo)
    engine.invoke()
    expected = [(d["name"], engine.get_tensor(d["index"])) for d in engine.get_output_details()]
    got = ei.Session(ei.convert(source), backend="numpy").run({"input": photo})
    _check_baseline(output, document, "raw LiteRT (original file)", source, expected, got)
    assert "raw litert" not in {r["backend"] for r in document["latency"]}  # the same file is not timed twice


def test_bench_peers_times_the_onnx_file_on_onnxruntime_as_the_baseline(tmp_path):
    from pathlib import Path

    import onnxruntime as ort

    source = Path(__file__).resolve().parents[1] / "models" / "sample_cnn.onnx"
    feed = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", feed)
    output, document = _bench_json(tmp_path, source, "--backend", "numpy,onnxruntime", "-i", f"input={tmp_path / 'x.npy'}")
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = list(zip(names, session.run(None, {"input": feed}), strict=True))
    got = ei.Session(ei.convert(source), backend="numpy").run({"input": feed})
    _check_baseline(output, document, "raw onnxruntime (original file)", source, expected, got)


def _torchscript(folder):
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                 torch.nn.Linear(4 * 6 * 6, 2)).eval()
    path = folder / "tiny.pt"
    torch.jit.save(torch.jit.trace(module, torch.randn(1, 3, 8, 8)), str(path))
    return path


def test_bench_peers_runs_torchscript_on_torch_for_an_eim_whose_source_is_next_to_it(tmp_path):
    import torch

    source = _torchscript(tmp_path)
    model = ei.convert(source, input_shapes={"input": (1, 3, 8, 8)})
    model.save(tmp_path / "tiny.eim")
    feed = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", feed)
    output, document = _bench_json(tmp_path, tmp_path / "tiny.eim", "--backend", "numpy,onnxruntime",
                                   "-i", f"input={tmp_path / 'x.npy'}")
    with torch.no_grad():
        expected = [(model.outputs[0].name, torch.jit.load(str(source))(torch.from_numpy(feed)).numpy())]
    got = ei.Session(model, backend="numpy").run({"input": feed})
    _check_baseline(output, document, "raw torch (original file)", source, expected, got)
    # and the TorchScript file itself as the bench's source (the library call; the CLI asks for shapes)
    reports = bench.latency(model, ["numpy"], {"input": feed}, threads=1, runs=2, warmup=0, source=source,
                            native=True, profile=False)
    assert [r.backend for r in reports] == ["numpy", "raw torch (original file)"]
    assert reports[0].native_check["within_tolerance"] and reports[0].vs_native > 0


def test_bench_peers_on_an_eim_without_its_source_says_so_in_one_line(tmp_path, onnx_file):
    model = ei.convert(onnx_file)
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    model.save(folder / "mlp.eim")
    output, document = _bench_json(tmp_path, folder / "mlp.eim", "--backend", "numpy")
    reason = f"no original file to compare with: {folder / 'mlp.eim'} was converted from mlp.onnx, which is not next to it"
    assert document["native"] == {"label": None, "none": reason}
    assert [line for line in output.splitlines() if "original file" in line] == [reason]
    assert not any(r["native"] for r in document["latency"]) and "vs original" not in output


@pytest.mark.parametrize("recorded, why", [(None, "records no source file"),
                                           ("../mlp.onnx", "which is not a bare file name"),
                                           ("mlp.keras", "bench runs no native engine for .keras files")])
def test_an_eim_names_its_original_file_only_as_a_file_next_to_it(tmp_path, mlp_model, recorded, why):
    model = ei.convert(mlp_model)
    if recorded is not None:
        model.metadata["source_file"] = recorded
        (tmp_path / recorded).write_bytes(b"")  # present, so only the name decides
    with pytest.raises(peers.NoOriginalFile, match=re.escape(why)):
        peers.original_file(tmp_path / "model.eim", model)


def test_a_native_engine_that_cannot_run_the_file_is_a_failed_row_saying_why(tmp_path, onnx_file, monkeypatch):
    def refuse(data, threads):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : simulated load failure")

    monkeypatch.setattr(peers, "_onnxruntime", refuse)
    output, document = _bench_json(tmp_path, onnx_file, "--backend", "numpy")
    label = "raw onnxruntime (original file)"
    assert f"{label} failed: RuntimeError: [ONNXRuntimeError] : 1 : FAIL : simulated load failure" in output
    row = next(line for line in output.splitlines() if line.startswith("│") and label in line)
    assert "failed" in row
    assert document["native"] == {"label": label, "failed": document["failed"][label]}
    assert [r["backend"] for r in document["latency"] if not r["peer"]] == ["numpy"]  # the others still timed


def test_compare_outputs_bounds_each_output_by_its_own_largest_magnitude():
    rng = np.random.default_rng(0)
    big, small = 100 * rng.standard_normal((2, 8)), rng.standard_normal(5)
    bound_big = bench.NATIVE_RTOL * np.abs(big).max() + bench.NATIVE_ATOL
    close = {"a": big + 0.5 * bound_big, "b": small}
    check = bench.compare_outputs(["a", "b"], [big, small], close)
    assert check["within_tolerance"] and check["output"] == "a"
    assert check["max_abs_error"] == pytest.approx(0.5 * bound_big) and check["tolerance"] == pytest.approx(bound_big)
    far = {"a": big, "b": small + 2 * (bench.NATIVE_RTOL * np.abs(small).max() + bench.NATIVE_ATOL)}
    assert not bench.compare_outputs(["a", "b"], [big, small], far)["within_tolerance"]
    nan = {"a": big, "b": np.where(np.arange(5) == 2, np.nan, small)}
    assert bench.compare_outputs(["a", "b"], [big, small], nan) == {
        "within_tolerance": False, "output": "b", "max_abs_error": None, "tolerance": pytest.approx(
            bench.NATIVE_RTOL * np.abs(small).max() + bench.NATIVE_ATOL)}
    shape = bench.compare_outputs(["a", "b"], [big, small], {"a": big.T, "b": small})
    assert not shape["within_tolerance"] and "(8, 2)" in shape["note"]


def test_an_original_file_that_computes_otherwise_is_reported_not_hidden(tmp_path, onnx_file, mlp_model):
    """An .eim names its source by file name only: if the file next to it has changed since, the
    check says that edgeinfer and the file disagree (here: the file's last weights doubled)."""
    import onnxruntime as ort
    from onnx import numpy_helper

    model = ei.convert(onnx_file)
    model.save(tmp_path / "mlp.eim")
    changed = onnx.ModelProto()
    changed.CopyFrom(mlp_model)
    weight = next(t for t in changed.graph.initializer if t.name == "w2")
    weight.CopyFrom(numpy_helper.from_array(2 * numpy_helper.to_array(weight), "w2"))
    onnx.save(changed, onnx_file)
    feed = np.random.default_rng(2).standard_normal((1, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", feed)
    output, document = _bench_json(tmp_path, tmp_path / "mlp.eim", "--backend", "numpy", "-i", f"x={tmp_path / 'x.npy'}")
    check = document["native"]["outputs"]["numpy"]
    theirs = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"]).run(None, {"x": feed})[0]
    ours = ei.Session(model, backend="numpy").run({"x": feed})["y"]
    assert not check["within_tolerance"] and check["output"] == "y"
    assert check["max_abs_error"] == pytest.approx(float(np.abs(ours - theirs).max()), rel=1e-3)
    assert f"numpy DIFFERS: max error {check['max_abs_error']:.2g} on 'y'" in output
