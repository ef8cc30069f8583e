#!/usr/bin/env bash
# CI step: the integer-kernel tests on an x86-64 CPU with AVX2 only (no AVX-512, no VNNI),
# whatever the host: QEMU's TCG (qemu-x86_64-static -cpu Haswell) has no AVX-512, so
# onnxruntime takes its AVX2 u8 x s8 path, which saturates (its probe returns 65534, not
# 129540). The host's own interpreter and virtualenv run emulated; only tests whose models
# are built in numpy or onnx (no training, no TensorFlow) are in the subset, to keep it short.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
TESTS=(
    tests/backends/onnxruntime/test_int8.py
    tests/backends/openvino/test_openvino_int8.py
    tests/backends/numpy/test_nn_random.py::test_qlinear_conv_per_channel_matches_onnxruntime
    tests/backends/numpy/test_nn_random.py::test_matmul_integer_per_row_and_column_zero_points
    tests/quantize/test_dynamic_fp16.py::test_dynamic_quantization_is_accurate_on_every_backend
    tests/quantize/test_static.py::test_symmetric_int8_activations_keep_the_clamps
    tests/quantize/test_reduce_range.py
)
NAME="avx2 int8"
source .ci/qemu.sh
[ -x "$PYTHON" ] || fail "no host interpreter at $PYTHON (run make install first, or set PYTHON)"
need_qemu qemu-x86_64-static
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
# QEMU warns once per CPUID feature it cannot emulate (harmless): those lines are dropped
qemu-x86_64-static -cpu Haswell "$PYTHON" -m pytest -q -rs -p no:cacheprovider "${TESTS[@]}" \
    2> >(grep -v "TCG doesn't support requested feature" >&2) | tee "$LOG" \
    || fail "integer-kernel tests failed on the emulated AVX2 CPU"
# test_int8.py skips its raw-onnxruntime comparisons where the probe saturates, saying so: on a
# CPU that does not saturate this step would test nothing
grep -q "saturate on this CPU (probe: " "$LOG" \
    || fail "onnxruntime did not saturate on the emulated CPU (no probe skip in the output above)"
# and OpenVINO's exact path must have been taken there (its test skips where the kernels are exact)
! grep -q "OpenVINO's u8 x s8 kernels are exact here" "$LOG" \
    || fail "OpenVINO did not saturate on the emulated CPU: its exact path was not tested"
step "done"
