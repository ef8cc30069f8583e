"""Precision as a measured decision (``edgeinfer.runtime.precision``, ``precision=`` on Session,
``ei.compile`` and the CLI): the figures against fp32, what is offered where, the mixed search's
layer ranking, and the decision with bf16 hidden from the CPU (the AVX2 case) or present."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from edgeinfer.cli import main
from edgeinfer.errors import BackendError, EdgeInferError, ModelFormatError
from edgeinfer.runtime import precision as rules
from edgeinfer.runtime.options import AutoOptions

NO_REDUCED = "avx512_bf16,amx_bf16,avx512_fp16,amx_fp16,bf16,asimdhp,fphp"  # every flag a reduced unit shows as


def _outlier_model(bias: float = 3000.0):
    """An MLP whose second layer has two channels at ``bias`` that the third layer subtracts
    from each other: in bf16 (8 bits of mantissa) that cancellation loses the signal, as the OCR
    detector's outlier channel does."""
    rng = np.random.default_rng(0)
    w0, w1 = (rng.standard_normal((64, 64)).astype(np.float32) * 0.1 for _ in range(2))
    b1 = np.zeros(64, np.float32)
    b1[:2] = bias
    w2 = rng.standard_normal((64, 8)).astype(np.float32) * 0.1
    w2[0], w2[1] = 1.0, -1.0
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
             helper.make_node("Relu", ["h0"], ["r0"], name="relu0"),
             helper.make_node("MatMul", ["r0", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "B1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(a, n) for a, n in ((w0, "W0"), (w1, "W1"), (b1, "B1"), (w2, "W2"))])
    return ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _samples(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(count)]


def _reference(model, samples):
    with ei.Session(model, backend="numpy") as session:
        return [session.run(s) for s in samples]


def _has(backend: str) -> bool:
    from edgeinfer.backend import available_backends

    return backend in available_backends()


def _bf16_offered() -> bool:
    return _has("openvino") and any(o.backend == "openvino" for o in rules.offers(["openvino"], ["bf16"])[0])


# -- the figures -----------------------------------------------------------------------------------

def test_output_errors_are_sqnr_and_max_error_over_all_samples():
    rng = np.random.default_rng(3)
    reference = [{"a": rng.standard_normal((5, 7)).astype(np.float32)} for _ in range(3)]
    noise = [rng.standard_normal((5, 7)).astype(np.float32) * 0.01 for _ in range(3)]
    got = [{"a": r["a"] + n} for r, n in zip(reference, noise, strict=True)]
    found = rules.output_errors(reference, got)["a"]
    ref = np.concatenate([r["a"].ravel() for r in reference]).astype(np.float64)
    diff = np.concatenate([(g["a"] - r["a"]).ravel() for g, r in zip(got, reference, strict=True)]).astype(np.float64)
    assert found.sqnr_db == pytest.approx(10 * np.log10((ref @ ref) / (diff @ diff)), rel=1e-9)
    assert found.max_error == pytest.approx(np.abs(diff).max() / (ref.max() - ref.min()), rel=1e-9)
    assert rules.output_errors(reference, reference)["a"].sqnr_db == math.inf


def test_integer_outputs_must_match_and_shapes_must_agree():
    ints = [{"k": np.array([1, 2, 3])}]
    assert rules.output_errors(ints, [{"k": np.array([1, 2, 4])}])["k"].sqnr_db == -math.inf
    assert rules.output_errors(ints, ints)["k"].sqnr_db == math.inf
    assert rules.output_errors([{"a": np.zeros(3)}], [{"a": np.zeros(4)}])["a"].sqnr_db == -math.inf


def test_nan_where_fp32_has_none_fails_every_tolerance():
    """An fp16 ResNet-50 on OpenVINO gave 1000 NaN class scores where fp32 gave 0.001 each."""
    reference = [{"p": np.full(10, 1e-3, np.float32), "q": np.array([1.0, np.inf, np.nan], np.float32)}]
    got = [{"p": np.full(10, np.nan, np.float32), "q": np.array([1.0, np.inf, np.nan], np.float32)}]
    found = rules.output_errors(reference, got)
    assert found["p"] == rules.OutputError(-math.inf, math.inf)
    assert "'p'" in rules.failure(found, rules.Tolerance()) and "lost (NaN" in rules.failure(found, rules.Tolerance())
    assert found["p"].as_json() == {"sqnr_db": None, "max_error": None}
    assert rules._figures_text(found["p"].as_json()).startswith("lost")
    assert found["q"].sqnr_db == math.inf  # the same NaN and inf in both: nothing lost
    flipped = rules.output_errors(reference, [{"p": reference[0]["p"], "q": np.array([1.0, -np.inf, np.nan])}])
    assert flipped["q"].sqnr_db == -math.inf


def test_failure_names_the_output_and_the_figure():
    tolerance = rules.Tolerance(sqnr_db=30, max_error=0.05)
    assert rules.failure({"a": rules.OutputError(40.0, 0.01)}, tolerance) is None
    low = rules.failure({"a": rules.OutputError(40.0, 0.01), "b": rules.OutputError(21.5, 0.01)}, tolerance)
    assert "'b'" in low and "21.5 dB" in low
    wide = rules.failure({"a": rules.OutputError(45.0, 0.2)}, tolerance)
    assert "'a'" in wide and "20.00%" in wide


def test_tolerance_forms_and_bad_ones():
    assert rules.tolerance_of(None) == rules.Tolerance()
    assert rules.tolerance_of(25) == rules.Tolerance(sqnr_db=25.0)
    assert rules.tolerance_of({"max_error": 0.1}) == rules.Tolerance(max_error=0.1)
    for bad in ("30", {"sqnr": 30}, float("nan"), {"max_error": -1}, True):
        with pytest.raises(BackendError, match="tolerance"):
            rules.tolerance_of(bad)
    with pytest.raises(BackendError, match="precision 'int4'"):
        rules.check_precision("int4")


# -- what is offered -------------------------------------------------------------------------------

def test_native_units_come_from_the_isa():
    x86 = rules.native_precisions({"avx2", "fma"}, "x86_64")
    assert all("emulated, not timed" in why for why in x86.values())
    assert rules.native_precisions({"avx2", "avx512_bf16"}, "x86_64")["bf16"] is None
    assert rules.native_precisions({"amx_bf16"}, "x86_64")["fp16"] is not None
    arm = rules.native_precisions({"asimd", "asimdhp"}, "aarch64")
    assert arm["fp16"] is None and arm["bf16"] is not None


def test_emulated_configurations_are_never_offered():
    engines = [name for name in ("onnxruntime", "openvino", "torch", "tflite") if _has(name)]
    found, refused = rules.offers(engines, rules.REDUCED, native=rules.native_precisions({"avx2"}, "x86_64"))
    assert found == []
    assert set(refused) == {f"{name}[{p}]" for name in engines for p in rules.REDUCED}
    assert all(why.startswith("not offered: ") for why in refused.values())


@pytest.mark.skipif(not _has("torch"), reason="torch is not installed")
@pytest.mark.parametrize("bf16_native", [True, False])
def test_an_accelerator_is_offered_by_its_own_units(monkeypatch, bf16_native):
    """torch on a GPU: fp16 whatever the CPU has, bf16 where the GPU computes it (no GPU here:
    torch's answer is replaced); the candidate keys its options by the engine, names the device."""
    import torch

    from edgeinfer.runtime.auto_precision import reduced_candidates

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16_native)
    monkeypatch.setenv("EDGEINFER_CPU_FLAGS_OFF", NO_REDUCED)  # the CPU's units do not matter
    candidates, refused = reduced_candidates([["torch@cuda:0", "onnxruntime@cpu", "numpy"]], "auto")
    labels = {c.label: c for c in candidates}
    assert labels["torch@cuda:0[fp16],numpy"].overrides == {"torch": {"precision": "fp16"}}
    assert ("torch@cuda:0[bf16],numpy" in labels) == bf16_native
    assert bf16_native or "no native bf16" in refused["torch@cuda:0[bf16]"]
    assert not any("onnxruntime" in label for label in (*labels, *refused))  # pinned to the CPU: offered as itself


def test_cpu_flags_off_hides_bf16(monkeypatch):
    monkeypatch.setenv("EDGEINFER_CPU_FLAGS_OFF", NO_REDUCED)
    assert all(why is not None for why in rules.native_precisions().values())


# -- the mixed search's ranking --------------------------------------------------------------------

def test_noisiest_node_is_the_one_that_adds_the_noise():
    """A "reduced" run that perturbs one layer's weights: the ranking puts that layer first,
    although every node after it sees the noise too (added noise, not total)."""
    model = _outlier_model(bias=0.0)
    graph = model.graph
    target = next(node for node in graph.nodes if node.name == "mm1")
    weight = next(name for name in target.inputs if name in graph.initializers)
    samples = _samples(2)

    def run_observed(observing, reduced: bool):
        run = observing.replace(initializers={
            **observing.initializers, weight: np.asarray(observing.initializers[weight]) * np.float32(1.05)}) \
            if reduced else observing
        with ei.Session(ei.Model(run, model.metadata), backend="numpy") as session:
            return [session.run(s) for s in samples]

    ranked = rules.noisiest_nodes(graph, run_observed)
    assert rules.node_names(graph, [ranked[0][0]])[0].startswith("mm1")
    assert ranked[0][1] > 10 * max(added for _, added in ranked[1:])


def test_feeding_chain_stops_at_the_last_matrix_product():
    graph = _outlier_model().graph
    last = graph.outputs[0].name
    names = rules.node_names(graph, rules.feeding_chain(graph, last))
    assert names[0].startswith("mm2")
    assert any(n.startswith("mm1") for n in names) and any(n.startswith("relu ") for n in names)
    assert not any(n.startswith(("mm0", "relu0")) for n in names)


# -- the decision ----------------------------------------------------------------------------------

@pytest.mark.skipif(not _has("openvino"), reason="OpenVINO is not installed")
def test_without_bf16_units_auto_keeps_fp32_and_times_no_reduced_candidate(monkeypatch):
    monkeypatch.setenv("EDGEINFER_CPU_FLAGS_OFF", NO_REDUCED)
    model, samples = _outlier_model(bias=0.0), _samples(2)
    with ei.Session(model, backend="openvino", precision="auto", samples=samples,
                    options=AutoOptions(cache=False)) as session:
        choice = session.auto_choice
        assert choice.precision == "fp32" and choice.options == {}
        assert not [label for label in (*choice.median_ms, *choice.skipped) if "[" in label]  # none timed
        notes = choice.precision_notes
        assert "emulated, not timed" in notes["openvino[bf16]"] and "emulated" in notes["openvino[fp16]"]
        lines = rules.describe(session.precision_record)
        assert lines[0].startswith("precision: fp32") and any("openvino[bf16]: not offered" in ln for ln in lines)
    with pytest.raises(EdgeInferError, match="precision='bf16': no engine among the candidates offers it"):
        ei.Session(model, backend="auto", precision="bf16", samples=samples, options=AutoOptions(cache=False))


@pytest.mark.skipif(not _has("openvino"), reason="OpenVINO is not installed")
def test_no_samples_no_reduced_candidate():
    model = _outlier_model(bias=0.0)
    with ei.Session(model, backend="openvino", precision="auto", options=AutoOptions(cache=False)) as session:
        assert session.auto_choice.precision == "fp32"
        assert all("no samples" in why for label, why in session.auto_choice.precision_notes.items()
                   if "openvino" in label and "emulated" not in why)


@pytest.mark.skipif(not _bf16_offered(), reason="this CPU (or OpenVINO) has no native bf16")
def test_outlier_layer_stays_fp32_and_is_named():
    model, samples = _outlier_model(), _samples(3)
    reference = _reference(model, samples)
    with ei.Session(model, backend="openvino", precision="auto", samples=samples,
                    options=AutoOptions(cache=False)) as session:
        choice = session.auto_choice
        assert "outside the tolerance" in choice.skipped["openvino[bf16],numpy"]
        mixed = choice.kept_fp32.get("openvino[bf16 mixed],numpy")
        assert mixed is not None and any(name.startswith("mm2") for name in mixed)
        text = "\n".join(rules.describe(session.precision_record))
        assert "mm2 (MatMul)" in text
        got = [session.run(s) for s in samples]
    assert rules.failure(rules.output_errors(reference, got), rules.Tolerance()) is None


@pytest.mark.skipif(not _bf16_offered(), reason="this CPU (or OpenVINO) has no native bf16")
def test_compiled_file_keeps_the_precision_and_its_error(tmp_path):
    model, samples = _outlier_model(bias=0.0), _samples(2)
    path = tmp_path / "m.eim"
    ei.compile(model, path, backend="openvino", precision="bf16", samples=samples, example_feeds=samples[0])
    loaded = ei.load(path)
    record = loaded.compiled.precision
    assert record["precision"] == "bf16" and record["engine_options"] == {"openvino": {"precision": "bf16"}}
    assert record["error"]["y"]["sqnr_db"] > 20  # bf16 of a well-conditioned MLP, measured at compile
    with ei.Session(path) as session:
        assert session.backend_options["openvino"]["precision"] == "bf16"
        assert session.precision_record["precision"] == "bf16"
        errors = rules.output_errors(_reference(model, samples), [session.run(s) for s in samples])
    assert errors["y"].sqnr_db == pytest.approx(record["error"]["y"]["sqnr_db"], abs=3)


@pytest.mark.skipif(not _has("openvino"), reason="OpenVINO is not installed")
def test_compiled_fp32_decision_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_CPU_FLAGS_OFF", NO_REDUCED)
    model, samples = _outlier_model(bias=0.0), _samples(2)
    path = tmp_path / "m.eim"
    ei.compile(model, path, backend="openvino", precision="auto", samples=samples, example_feeds=samples[0],
               options=AutoOptions(cache=False))
    record = ei.load(path).compiled.precision
    assert record["precision"] == "fp32" and record["engine_options"] == {}
    assert "emulated" in record["not_offered"]["openvino[bf16]"]


def test_a_file_may_carry_only_precision_options(tmp_path):
    from edgeinfer.format.eim import save_model

    model = _outlier_model(bias=0.0)
    path = tmp_path / "m.eim"
    ei.compile(model, path, backend="numpy", example_feeds=_samples(1)[0])
    loaded = ei.load(path)
    loaded.compiled.precision = {"precision": "bf16", "engine_options": {"openvino": {"precision": "bf16",
                                                                                     "CACHE_DIR": "/tmp/x"}},
                                 "error": {}, "kept_fp32": [], "not_offered": {}}
    hostile = tmp_path / "hostile.eim"
    save_model(loaded, hostile)
    with pytest.raises(ModelFormatError, match="engine_options.openvino: expected only options that set a "
                                               "precision.*found CACHE_DIR"):
        ei.load(hostile)


def test_a_named_engine_takes_a_fixed_precision_as_its_option():
    model = _outlier_model(bias=0.0)
    with pytest.raises(BackendError, match="computes in fp32 only"):
        ei.Session(model, backend="numpy", precision="bf16")
    with ei.Session(model, backend="numpy", precision="fp32") as session:
        assert session.run(_samples(1)[0])["y"].shape == (4, 8)
    if _has("openvino"):
        with ei.Session(model, backend="openvino", precision="bf16") as session:
            assert session.backend_options["openvino"]["precision"] == "bf16"


# -- the command line ------------------------------------------------------------------------------

def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_cli_tolerance_needs_a_reduced_precision(tmp_path):
    path = tmp_path / "m.eim"
    _outlier_model(bias=0.0).save(path)
    result = _invoke("run", path, "--random-inputs", "--tolerance", 20, "--repeat", 1)
    assert result.exit_code == 2
    assert "--tolerance, --max-error and --sample: expected with --precision auto" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.skipif(not _has("openvino"), reason="OpenVINO is not installed")
def test_cli_run_reports_the_precision(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "m.eim"
    _outlier_model(bias=0.0).save(path)
    result = _invoke("run", path, "--random-inputs", "--backend", "openvino", "--precision", "auto", "--repeat", 1)
    assert result.exit_code == 0, result.output
    assert "precision: fp32" in result.output
    assert "no samples" in result.output or "emulated" in result.output  # random data checks nothing
    sample = tmp_path / "s.npz"
    np.savez(sample, **_samples(1)[0])
    bad = tmp_path / "bad.npz"
    np.savez(bad, z=np.zeros(3))
    result = _invoke("run", path, "--random-inputs", "--precision", "auto", "--sample", bad, "--repeat", 1)
    assert result.exit_code == 2 and "expected every input of the model (x), found z" in result.output


# -- torch: nodes kept fp32 ------------------------------------------------------------------------

@pytest.mark.skipif(not _has("torch"), reason="torch is not installed")
def test_torch_computes_the_named_nodes_in_fp32():
    """torch's bf16 (computed, or emulated where the CPU has no units: the same numbers) loses the
    outlier model's cancellation; with the nodes from mm1 to the output kept fp32 it holds."""
    model, samples = _outlier_model(), _samples(2)
    reference = _reference(model, samples)
    kept = rules.feeding_chain(model.graph, model.graph.outputs[0].name)
    with ei.Session(model, backend="torch", precision="bf16") as plain, \
            ei.Session(model, backend="torch", precision="bf16", fp32_nodes=kept) as mixed:
        lost = rules.output_errors(reference, [plain.run(s) for s in samples])
        held = rules.output_errors(reference, [mixed.run(s) for s in samples])
    assert lost["y"].sqnr_db < 10
    assert rules.failure(held, rules.Tolerance()) is None and held["y"].sqnr_db > 40
    with pytest.raises(BackendError, match="fp32_nodes must be a list"):
        ei.Session(model, backend="torch", precision="bf16", fp32_nodes="mm1")


@pytest.mark.skipif(not (_has("torch") and rules.native_precisions()["bf16"] is None),
                    reason="torch is not installed or this CPU has no native bf16")
def test_auto_finds_torchs_mixed_form():
    model, samples = _outlier_model(), _samples(3)
    with ei.Session(model, backend="torch", precision="auto", samples=samples,
                    options=AutoOptions(cache=False)) as session:
        choice = session.auto_choice
        kept = choice.kept_fp32.get("torch[bf16 mixed],numpy")
        assert kept is not None and any(name.startswith("mm2") for name in kept)
        assert "outside the tolerance" in choice.skipped["torch[bf16],numpy"]


@pytest.mark.skipif(not _has("openvino"), reason="OpenVINO is not installed")
def test_cli_bench_reports_each_contenders_precision_and_error(tmp_path):
    import json

    path = tmp_path / "m.eim"
    model = _outlier_model()
    model.save(path)
    result = _invoke("bench", path, "--backend", "numpy,openvino", "--precision", "bf16", "--runs", 2, "--warmup", 0,
                     "--top", 0, "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    [report] = document["latency"]  # numpy computes fp32 only: it failed, saying so
    assert "computes in fp32 only" in document["failed"]["numpy"]
    assert report["compute_precision"] == "bf16" and set(report["precision_error"]) == {"y"}


@pytest.mark.skipif(not _bf16_offered(), reason="this CPU (or OpenVINO) has no native bf16")
def test_a_fixed_precision_without_samples_runs_unchecked_and_says_so(caplog):
    model = _outlier_model(bias=0.0)
    with caplog.at_level("WARNING"), ei.Session(model, backend="auto", precision="bf16",
                                                options=AutoOptions(cache=False)) as session:
        choice = session.auto_choice
        assert choice.precision == "bf16" and not choice.errors
        assert choice.precision_notes[choice.label] == "not checked against fp32: no samples"
    assert "used unchecked" in caplog.text
