#!/usr/bin/env bash
# CI step: a smoke subset on aarch64 under QEMU user emulation (.ci/arm_smoke.py says what).
#
# What it sets up (as /work/shared/CPUS.md measured it; root on a Debian 12 image, no binfmt_misc):
#   - qemu-user-static (apt), for /usr/bin/qemu-aarch64-static;
#   - an arm64 root: Debian's arm64 python3.11 and the libraries it loads, unpacked with dpkg -x;
#   - aarch64 wheels from PyPI (pip download --platform), unzipped into one site folder, with
#     onnxruntime pinned to 1.20.1 for this step only: 1.32's aarch64 wheel crashes (SIGSEGV) at
#     `import onnxruntime` under qemu-user, in its CPU detection; 1.20.1 imports and runs.
#     The other packages take the versions of the host's virtualenv, so both sides run alike;
#   - edgeinfer itself, pure Python, installed from this checkout into its own folder.
# Downloads stay in $EDGEINFER_ARM_CACHE (default ~/.cache/edgeinfer-arm): a rerun downloads nothing.
# The x86-64 reference is computed natively by the same script, then the emulated run compares.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
CACHE=${EDGEINFER_ARM_CACHE:-$HOME/.cache/edgeinfer-arm}
ORT_ARM=1.20.1
DEBS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3.11 libc6 libexpat1 zlib1g
      libssl3 libffi8 libbz2-1.0 liblzma5 libsqlite3-0 libgcc-s1 libstdc++6 libuuid1 libncursesw6
      libtinfo6 libreadline8 libgomp1 libdb5.3 libnsl2 libtirpc3 libcrypt1 libgssapi-krb5-2 libkrb5-3
      libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1)
# import names of the host's packages whose versions the aarch64 side takes
SAME_AS_HOST=(numpy onnx protobuf flatbuffers click rich markdown-it-py mdurl pygments threadpoolctl
              ml-dtypes typing-extensions)
PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)

NAME="arm smoke"
source .ci/qemu.sh
mkdir -p "$CACHE"
[ -x "$PYTHON" ] || fail "no host interpreter at $PYTHON (run make install first, or set PYTHON)"

# 1. the emulator
need_qemu qemu-aarch64-static

# 2. the arm64 root with Debian's python3.11
ROOT="$CACHE/root"
ROOT_STAMP="$ROOT/.packages"
if [ ! -f "$ROOT_STAMP" ] || [ "$(cat "$ROOT_STAMP")" != "${DEBS[*]}" ]; then
    [ "$(id -u)" = 0 ] || fail "the arm64 root must be built once as root (dpkg --add-architecture, apt-get download)"
    command -v dpkg >/dev/null || fail "dpkg is missing: this step needs a Debian-based image"
    step "downloading ${#DEBS[@]} arm64 packages"
    dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
    apt-get update -qq || fail "apt-get update failed (with the arm64 architecture added)"
    rm -rf "$CACHE/debs" "$ROOT.partial" && mkdir -p "$CACHE/debs" "$ROOT.partial"
    (cd "$CACHE/debs" && apt-get download -qq "${DEBS[@]/%/:arm64}") || fail "apt-get download of the arm64 packages failed"
    for deb in "$CACHE"/debs/*.deb; do dpkg -x "$deb" "$ROOT.partial" || fail "dpkg -x $deb failed"; done
    echo "${DEBS[*]}" > "$ROOT.partial/.packages"
    rm -rf "$ROOT" && mv "$ROOT.partial" "$ROOT" && rm -rf "$CACHE/debs"
fi
EMULATED=(qemu-aarch64-static -L "$ROOT" "$ROOT/usr/bin/python3.11")
machine=$("${EMULATED[@]}" -c "import platform; print(platform.machine())") \
    || fail "the emulated python3.11 does not start: ${EMULATED[*]}"
[ "$machine" = aarch64 ] || fail "the emulated interpreter reports machine $machine, expected aarch64"

# 3. aarch64 wheels, unzipped into one site folder
REQUIREMENTS=$("$PYTHON" - "${SAME_AS_HOST[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"arm smoke: {name} is not installed in the host interpreter")
EOF
) || fail "cannot read the host's package versions"
REQUIREMENTS="$REQUIREMENTS onnxruntime==$ORT_ARM"
SITE="$CACHE/site"
if [ ! -f "$SITE/.requirements" ] || [ "$(cat "$SITE/.requirements")" != "$REQUIREMENTS" ]; then
    step "downloading aarch64 wheels: $(echo $REQUIREMENTS)"
    rm -rf "$CACHE/wheels" "$SITE.partial" && mkdir -p "$CACHE/wheels"
    # shellcheck disable=SC2086  # one argument per requirement
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: "${PLATFORMS[@]}" \
        --python-version 3.11 --implementation cp -d "$CACHE/wheels" $REQUIREMENTS \
        || fail "pip download of the aarch64 wheels failed"
    "$PYTHON" - "$CACHE/wheels" "$SITE.partial" <<'EOF' || fail "unpacking the aarch64 wheels failed"
import sys, zipfile
from pathlib import Path
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    zipfile.ZipFile(wheel).extractall(sys.argv[2])
EOF
    # the host's 3.11 compiles the pure-Python parts once: the emulated 3.11 reads the same .pyc
    "$PYTHON" -m compileall -q -j 0 "$SITE.partial" >/dev/null || true
    echo "$REQUIREMENTS" > "$SITE.partial/.requirements"
    rm -rf "$SITE" && mv "$SITE.partial" "$SITE" && rm -rf "$CACHE/wheels"
fi

# 4. this checkout, built as its wheel builds it (setup.py maps backends/ and converters/ into edgeinfer)
PROJECT="$CACHE/project"
rm -rf "$PROJECT"
leftovers=()  # what setuptools leaves in the checkout, removed again unless it was there before
for made in build edgeinfer.egg-info; do [ -e "$made" ] || leftovers+=("$made"); done
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --target "$PROJECT" . \
    >"$CACHE/install.log" 2>&1 || { cat "$CACHE/install.log" >&2; fail "pip install --target of this checkout failed"; }
rm -rf "${leftovers[@]}"
cp -r devkit "$PROJECT/devkit"  # the test helpers (assert_close), which the wheel does not ship

# 5. the x86-64 reference, natively, then the same subset emulated
WORK="$CACHE/work"
rm -rf "$WORK"
step "x86-64 reference"
"$PYTHON" .ci/arm_smoke.py reference "$WORK" || fail "the x86-64 reference failed"
step "aarch64 run under QEMU"
status=0
env -i HOME="$HOME" PATH=/usr/bin:/bin PYTHONNOUSERSITE=1 PYTHONPATH="$PROJECT:$SITE" \
    "${EMULATED[@]}" .ci/arm_smoke.py check "$WORK" || status=$?
step "done"
[ "$status" = 0 ] || fail "the aarch64 smoke subset failed (exit status $status; the lines above say which checks)"
