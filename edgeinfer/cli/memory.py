"""Peak resident memory of a piece of work, measured in this process.

``with PeakRSS() as peak: ...`` then ``peak.increase`` is how far the resident set size rose
above what it was when the block began, at its highest point inside the block.

How it is measured: on Linux the kernel keeps the high-water mark of the resident set
(``VmHWM`` in ``/proc/self/status``) and resets it on request (writing ``5`` to
``/proc/self/clear_refs``), so the peak is exact however short it lasted. Where that reset is
not allowed (macOS, Windows, some Android kernels), a thread samples the RSS (psutil, or
``/proc/self/statm``) every millisecond, which can miss a spike shorter than that; ``method``
says which one was used.

What it does not see: memory a previous piece of work freed to the allocator but the process
kept is reused without raising the RSS, so in one process an earlier contender can pay for
pages a later one reuses, and only the first to load a shared library pays for it.
``edgeinfer bench`` measures each contender alone (compile, first run and warm-up runs), right
after ``gc.collect()``, before timing them together; ``--memory isolated`` measures each again
in a fresh process of its own (``edgeinfer.cli.bench.isolated_peak_rss``), where neither happens.
"""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss() -> int:
    """The resident set size of this process, in bytes."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        pass
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        import resource  # no /proc: the lifetime peak is the best figure there is

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _high_water_mark() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_high_water_mark() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _high_water_mark() is not None


class PeakRSS:
    """The peak resident set size inside a ``with`` block, relative to its start."""

    def __init__(self, interval_s: float = 0.001):
        self.interval_s = interval_s
        self.baseline = 0
        self.peak = 0
        self.method = ""
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def __enter__(self) -> PeakRSS:
        gc.collect()
        if _reset_high_water_mark():
            self.method = "kernel high-water mark (VmHWM after clear_refs)"
            self.baseline = current_rss()
        else:
            self.method = f"RSS sampled every {self.interval_s * 1000:g} ms"
            self.baseline = self.peak = current_rss()
            self._sampler = threading.Thread(target=self._sample, name="edgeinfer-rss", daemon=True)
            self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, current_rss())

    def __exit__(self, *exc_info: object) -> None:
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self.peak = max(self.peak, current_rss())
        else:
            self.peak = max(_high_water_mark() or 0, current_rss())

    @property
    def increase(self) -> int:
        """Bytes the peak rose above the RSS at the start of the block (never negative)."""
        return max(0, self.peak - self.baseline)
