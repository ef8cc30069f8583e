#!/usr/bin/env bash
# The torch backend's device check, one prepared script (issue 24):
#   1. the torch backend's tests, and the device-resident hand-offs between parts
#      (tests/runtime/test_device_handoffs.py), on the device (EDGEINFER_TORCH_DEVICE), float32 kept float32
#      (NVIDIA_TF32_OVERRIDE=0: cuDNN would otherwise run float32 convolutions in TF32);
#   2. benchmarks/bench_gpu.py: ResNet-50, MobileNetV2 and an encoder block at batch 1 and 8
#      (fp32 / fp16, with and without CUDA graphs) against raw PyTorch eager, and a two-stage
#      CPU(onnxruntime) + GPU(torch) stream against all-CPU and all-GPU.
# It runs from a source checkout with numpy, onnx, onnxruntime, torch and ml_dtypes installed
# (no pip install, no network); pytest is optional (without it step 1 is skipped, and says so).
#
#   benchmarks/gpu_check.sh                    # cuda:0, about 3 minutes on an H200
#   benchmarks/gpu_check.sh --device cpu --quick   # the dry run on a machine without a GPU
# Results: $OUT (or /tmp/gpu_check_out) holds tests.log, bench_gpu.json and bench_gpu.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEVICE=cuda:0
QUICK=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=(--quick); shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (expected --device DEV, --quick)" >&2; exit 2 ;;
  esac
done
RESULTS=${OUT:-/tmp/gpu_check_out}
mkdir -p "$RESULTS"
TEST_SECONDS=${TEST_SECONDS:-180}
BENCH_SECONDS=${BENCH_SECONDS:-240}

"$PYTHON" - <<'PY' || exit 2
import importlib, sys
missing = []
for name in ("numpy", "onnx", "onnxruntime", "torch", "ml_dtypes"):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        missing.append(f"{name} ({exc})")
if missing:
    sys.exit("gpu_check.sh: missing required package(s): " + ", ".join(missing))
import torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, "
      f"devices: {[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
for name in ("pytest", "click", "rich", "threadpoolctl"):
    try:
        importlib.import_module(name)
    except ImportError:
        print(f"note: {name} is not installed (not needed by this check)")
PY

status=0
echo "== 1. torch backend tests on $DEVICE =="
if "$PYTHON" -c "import pytest" 2>/dev/null; then
  # bench_gpu's import makes this checkout importable (edgeinfer.backends -> backends/) first
  EDGEINFER_TORCH_DEVICE=$DEVICE NVIDIA_TF32_OVERRIDE=0 timeout "$TEST_SECONDS" "$PYTHON" -c "
import sys
sys.path.insert(0, 'benchmarks')
import bench_gpu  # noqa: F401  (a source checkout without an install works too)
import pytest
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--import-mode=importlib', '--tb=short', '-rfE', '--durations=10', 'tests/backends/torch', 'tests/runtime/test_device_handoffs.py']))
" 2>&1 | tee "$RESULTS/tests.log" | tail -40
  test_status=${PIPESTATUS[0]}
  [ "$test_status" -eq 124 ] && echo "tests: stopped after ${TEST_SECONDS}s"
  [ "$test_status" -ne 0 ] && status=1
else
  echo "pytest is not installed: tests skipped (bench_gpu.py still checks fp32 outputs against eager)" \
    | tee "$RESULTS/tests.log"
fi

echo "== 2. benchmark on $DEVICE =="
NVIDIA_TF32_OVERRIDE=0 timeout "$BENCH_SECONDS" "$PYTHON" benchmarks/bench_gpu.py --device "$DEVICE" "${QUICK[@]}" \
  --json "$RESULTS/bench_gpu.json" 2>&1 | tee "$RESULTS/bench_gpu.log"
bench_status=${PIPESTATUS[0]}
[ "$bench_status" -eq 124 ] && echo "benchmark: stopped after ${BENCH_SECONDS}s"
[ "$bench_status" -ne 0 ] && status=1
echo "gpu_check.sh: done (status $status); results in $RESULTS"
exit $status
