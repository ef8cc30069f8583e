"""The aarch64 smoke subset, run by ``.ci/arm_smoke.sh`` under QEMU user emulation.

    python .ci/arm_smoke.py reference WORK   # x86-64 host: models, inputs and reference outputs into WORK
    python .ci/arm_smoke.py check WORK       # aarch64: the same conversions and runs, compared with them

Cases: the ONNX, TFLite and Caffe converters (models/sample_cnn.onnx, its .tflite export,
models/caffe_lenet_digits), each run on the numpy backend and on onnxruntime; an ``.eim`` round
trip (same graph hash as on x86-64, same outputs after loading); and an INT8 model (quantized
on the host) on both backends. Results must equal the x86-64 ones within tolerance: float32
1e-4 relative (other CPUs sum in other orders: NEON FMA, other GEMM blockings), INT8 within
one output quantization step (onnxruntime requantizes in float32). Prints one line per check
and ``N passed, N failed`` last; exits 1 if any failed.
"""

from __future__ import annotations

import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FLOAT_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
BACKENDS = ("numpy", "onnxruntime")


def _sources(work: Path) -> dict[str, tuple[Path, dict]]:
    return {
        "onnx": (ROOT / "models" / "sample_cnn.onnx", {}),
        "tflite": (work / "sample_cnn.tflite", {}),
        "caffe": (ROOT / "models" / "caffe_lenet_digits" / "lenet_digits.prototxt",
                  {"weights": ROOT / "models" / "caffe_lenet_digits" / "lenet_digits.caffemodel"}),
    }


def _feeds(model) -> dict[str, np.ndarray]:
    """Inputs from a fixed seed: numpy's PCG64 draws the same numbers on every machine."""
    rng = np.random.default_rng(21)
    return {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in model.graph.inputs}


def _output(session, feeds) -> np.ndarray:
    return next(iter(session.run(feeds).values()))


def reference(work: Path) -> None:
    """On the host: write the .tflite and INT8 .eim the emulated run converts and loads, and
    every output it must reproduce."""
    import edgeinfer as ei
    from edgeinfer.format.tflite import save_tflite
    from edgeinfer.quantize import quantize

    work.mkdir(parents=True, exist_ok=True)
    save_tflite(ei.convert(ROOT / "models" / "sample_cnn.onnx").graph, work / "sample_cnn.tflite")
    fp32 = ei.convert(ROOT / "models" / "sample_cnn.onnx", optimize=2)
    rng = np.random.default_rng(7)
    calibration = [rng.standard_normal((1, 3, 64, 64)).astype(np.float32) for _ in range(4)]
    quantize(fp32, calibration, method="minmax").save(work / "sample_cnn.int8.eim")
    outputs, facts, errors = run_all(work)
    if errors:
        raise SystemExit(f"arm smoke: the x86-64 reference could not be computed: {errors}")
    np.savez(work / "reference.npz", **outputs)
    (work / "reference.json").write_text(json.dumps({**facts, "machine": platform.machine()}, indent=1))


def run_all(work: Path) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, str]]:
    """Every output of the subset on this machine (keys ``case/backend``), facts to compare, and
    the error of each case that could not run (keyed like its outputs' prefix)."""
    import edgeinfer as ei

    outputs: dict[str, np.ndarray] = {}
    facts: dict[str, str] = {}
    errors: dict[str, str] = {}

    def converted(name: str, path: Path, options: dict) -> None:
        model = ei.convert(path, **options)
        feeds = _feeds(model)
        for backend in BACKENDS:
            outputs[f"{name}/{backend}"] = _output(ei.Session(model, backend=backend), feeds)
        if name == "onnx":
            saved = work / f"roundtrip_{platform.machine()}.eim"
            model.save(saved)
            loaded = ei.load(saved)
            facts["eim_hash"] = loaded.graph.content_hash()
            outputs["eim/numpy"] = _output(ei.Session(loaded, backend="numpy"), feeds)

    def quantized() -> None:
        model = ei.load(work / "sample_cnn.int8.eim")
        feeds = _feeds(model)
        for backend in BACKENDS:
            session = ei.Session(model, backend=backend)
            outputs[f"int8/{backend}"] = _output(session, feeds)
            if backend == "onnxruntime":
                facts["int8_plan"] = session.plan.describe()
        facts["int8_output_step"] = str(_output_step(model.graph))

    cases = {name: (lambda n=name, p=path, o=options: converted(n, p, o))
             for name, (path, options) in _sources(work).items()}
    cases["int8"] = quantized
    for name, case in cases.items():
        try:
            case()
        except Exception as exc:  # the check reports it against every output of the case
            errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    return outputs, facts, errors


def _output_step(graph) -> float:
    """How far the float logits move when the last quantized activation moves one step: its
    scale times the largest L1 norm of a row of the final Gemm's dequantized weights."""
    gemm = graph.producer(graph.output_names[0])
    x_dq, w_dq = graph.producer(gemm.inputs[0]), graph.producer(gemm.inputs[1])
    weight, scale = (graph.values[name].const.astype(np.float64) for name in w_dq.inputs[:2])
    axis = int(w_dq.attrs.get("axis", 1))
    dequantized = weight * (scale.reshape([-1 if i == axis else 1 for i in range(weight.ndim)]) if scale.ndim else scale)
    rows = dequantized if int(gemm.attrs.get("transB", 0)) else dequantized.T
    return float(graph.values[x_dq.inputs[1]].const) * float(np.abs(rows).sum(axis=1).max())


def check(work: Path) -> int:
    from devkit.testing import assert_close
    from edgeinfer.backends.onnxruntime import int8

    started = time.perf_counter()
    expected = dict(np.load(work / "reference.npz"))
    expected_facts = json.loads((work / "reference.json").read_text())
    outputs, facts, errors = run_all(work)
    print(f"{platform.machine()}: ran the subset in {time.perf_counter() - started:.1f} s; onnxruntime integer "
          f"path here: {int8.integer_path()} (probe {int8.probe_value()})", flush=True)
    step = float(expected_facts["int8_output_step"])
    checks: dict[str, Callable[[], None]] = {}
    for key, ref in expected.items():
        if key.startswith("int8/"):  # integer kernels: within one step of the last quantized activation
            checks[f"{key} equals x86-64"] = (lambda k=key, r=ref: assert_close(outputs[k], r, rtol=0, atol=1.01 * step,
                                                                                 name=k))
        else:
            checks[f"{key} equals x86-64"] = lambda k=key, r=ref: assert_close(outputs[k], r, name=k, **FLOAT_TOLERANCE)
    checks["eim round trip: same graph hash as on x86-64"] = lambda: _same(facts["eim_hash"], expected_facts["eim_hash"])
    checks["eim round trip: outputs unchanged by save and load"] = \
        lambda: assert_close(outputs["eim/numpy"], outputs["onnx/numpy"], rtol=0, atol=0)
    checks["machine is aarch64"] = lambda: _same(platform.machine(), "aarch64")
    checks["int8 on onnxruntime takes an exact integer path"] = lambda: _exact(facts["int8_plan"])
    passed = failed = 0
    for name, run in checks.items():
        case = {"eim": "onnx"}.get(name.split("/")[0].split(" ")[0], name.split("/")[0].split(" ")[0])
        try:
            if case in errors:
                raise RuntimeError(f"case {case!r} did not run: {errors[case]}")
            run()
        except Exception as exc:  # every failure is reported, then counted
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        else:
            passed += 1
            print(f"ok   {name}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def _same(got: str, expected: str) -> None:
    if got != expected:
        raise AssertionError(f"got {got!r}, expected {expected!r}")


def _exact(plan: str) -> None:
    if "int8 exact" not in plan:
        raise AssertionError(f"the plan names no exact integer path: {plan!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("reference", "check"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    work = Path(argv[1])
    if argv[0] == "reference":
        reference(work)
        return 0
    return check(work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
