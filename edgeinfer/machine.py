"""What this machine's CPU is: its model and the instruction-set features that decide which
kernels the engines pick (read from ``/proc/cpuinfo``). Light to import: a compiled model's
load path asks it (``runtime.aot.machine_key``), and so do ``edgeinfer devices`` and
``precision="auto"`` (which reduced-precision configurations this CPU computes natively).

``$EDGEINFER_CPU_FLAGS_OFF`` (comma-separated ``/proc/cpuinfo`` flags, e.g.
``avx512_bf16,amx_bf16``) hides flags from all of them: what edgeinfer decides on a CPU without
those units can be checked on one that has them (engines still see the real CPU)."""

from __future__ import annotations

import os
import platform

# feature label -> /proc/cpuinfo flags (any of them), x86 and ARM
X86_FEATURES = {
    "AVX2": ("avx2",),
    "AVX-512": ("avx512f",),
    "AVX-512 VNNI": ("avx512_vnni",),
    "AVX-VNNI": ("avx_vnni",),
    "AMX-INT8": ("amx_int8",),
    "AMX-BF16": ("amx_bf16",),
    "BF16": ("avx512_bf16",),
    "FP16": ("avx512_fp16",),
    "AMX-FP16": ("amx_fp16",),
    "F16C": ("f16c",),
}
ARM_FEATURES = {
    "NEON": ("asimd", "neon"),
    "dotprod": ("asimddp",),
    "i8mm": ("i8mm",),
    "BF16": ("bf16",),
    "FP16": ("asimdhp", "fphp"),
    "SVE": ("sve",),
}


def cpu_flags(text: str | None = None) -> set[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on
    ARM); this machine's without those ``$EDGEINFER_CPU_FLAGS_OFF`` hides."""
    hidden: set[str] = set()
    if text is None:
        hidden = {flag.strip() for flag in os.environ.get("EDGEINFER_CPU_FLAGS_OFF", "").split(",") if flag.strip()}
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split()) - hidden
    return set()


def cpu_model(text: str | None = None) -> str:
    if text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            return platform.processor() or platform.machine()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "Processor", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def features(flags: set[str], architecture: str | None = None) -> dict[str, bool]:
    """Which of the features that matter this CPU has (x86 or ARM list, by architecture)."""
    architecture = (architecture or platform.machine()).lower()
    table = ARM_FEATURES if architecture.startswith(("arm", "aarch")) else X86_FEATURES
    return {label: any(flag in flags for flag in names) for label, names in table.items()}


def machine_key() -> str:
    """The CPU a compiled artifact is made for: architecture and the features that select kernels
    (``runtime.aot``: an artifact made on another CPU is not used)."""
    found = [label for label, present in features(cpu_flags()).items() if present]
    return f"{platform.machine()} {','.join(found)}"
