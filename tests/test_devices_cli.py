"""edgeinfer devices: the CPU's features from /proc/cpuinfo, the installed engines and their
devices, and the INT8 path each takes (onnxruntime's by its saturation probe)."""

from __future__ import annotations

import importlib.util
import json

from click.testing import CliRunner

from edgeinfer.cli import devices, main

X86 = """processor\t: 0
model name\t: Some x86 CPU
flags\t\t: fpu sse2 avx avx2 f16c avx512f avx512bw avx512_vnni
"""
ARM = """processor\t: 0
Features\t: fp asimd evtstrm aes asimdhp asimddp
Hardware\t: Some ARM SoC
"""


def test_features_are_read_from_cpuinfo_for_x86_and_arm():
    x86 = devices.features(devices.cpu_flags(X86), "x86_64")
    assert {k for k, v in x86.items() if v} == {"AVX2", "AVX-512", "AVX-512 VNNI", "F16C"}
    assert devices.cpu_model(X86) == "Some x86 CPU"
    arm = devices.features(devices.cpu_flags(ARM), "aarch64")
    assert {k for k, v in arm.items() if v} == {"NEON", "dotprod", "FP16"}
    assert devices.cpu_model(ARM) == "Some ARM SoC"
    assert devices._kernels(x86) == "VNNI" and devices._kernels(arm) == "dotprod"


def test_devices_reports_this_machine_and_each_installed_engine():
    result = CliRunner().invoke(main, ["devices", "--json", "-"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output)
    assert facts["features"] == devices.features(devices.cpu_flags())
    names = [engine["name"] for engine in facts["engines"]]
    assert names == [name for name, (module, _) in devices.ENGINES.items() if importlib.util.find_spec(module)]
    by_name = {engine["name"]: engine for engine in facts["engines"]}
    if "onnxruntime" in by_name:
        import onnxruntime

        from edgeinfer.backends.onnxruntime.int8 import integer_path

        assert by_name["onnxruntime"]["devices"] == onnxruntime.get_available_providers()
        assert by_name["onnxruntime"]["int8"].startswith(integer_path())
    if "torch" in by_name:
        from edgeinfer.backends.torch import available_devices

        assert by_name["torch"]["devices"] == available_devices()
    text = CliRunner().invoke(main, ["devices"]).output
    assert text.startswith("cpu      ") and "int8 path here" in text
    for name in names:
        assert f"  {name}" in text
