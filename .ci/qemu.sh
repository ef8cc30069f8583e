# Sourced by the CI steps that run under QEMU user emulation: messages, timing, the emulator.
# NAME must be set by the caller (its messages start with it).
START=$(date +%s)
fail() { echo "$NAME: $*" >&2; exit 1; }
step() { echo "$NAME: $* ($(( $(date +%s) - START )) s)"; }

# need_qemu BINARY: install Debian's qemu-user-static when BINARY is missing (root only).
need_qemu() {
    command -v "$1" >/dev/null && return 0
    [ "$(id -u)" = 0 ] || fail "$1 is missing and installing it needs root: apt-get install qemu-user-static"
    step "installing qemu-user-static"
    apt-get install -y -qq qemu-user-static >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq qemu-user-static >/dev/null; } \
        || fail "apt-get could not install qemu-user-static"
    command -v "$1" >/dev/null || fail "qemu-user-static is installed but $1 is not on PATH"
}
