"""How a numpy run with ``threads=N`` uses its threads.

Elementwise work (the depthwise conv's channel blocks, bias and activation epilogues of
GEMMs) is cut into chunks that the calling thread and up to ``N - 1`` helper threads take in
turn (``parallel_for``); numpy's copies and ufuncs release the GIL. The caller works through
the chunks itself and waits only for chunks a helper has already started, so a helper that
the OS does not schedule costs nothing. GEMMs are different: numpy's matmul does not run in
parallel from several Python threads (measured), so they stay whole and get BLAS threads
only when they are big (``blas_for``); the run keeps BLAS at one thread otherwise. BLAS's
own threads split each call statically and wait for each other, so on a loaded machine one
descheduled BLAS thread stalls the call for a whole time slice (measured: 0.5 ms GEMMs
taking 10-20 ms with two BLAS threads, interleaved with onnxruntime on two shared cores).

The worker count is per thread (``threading.local``), so executables running at once in
several threads each keep their own, and helpers never split their chunks again."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

_state = threading.local()
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def workers() -> int:
    """Threads a kernel may use in this thread's current run (1 outside a run)."""
    return getattr(_state, "workers", 1)


@contextlib.contextmanager
def use_workers(count: int) -> Iterator[None]:
    """Let kernels called from this thread split their work ``count`` ways while inside."""
    previous = workers()
    _state.workers = max(1, int(count))
    try:
        yield
    finally:
        _state.workers = previous


class RunThreads:
    """The context a run with ``threads`` executes in: BLAS at one thread (``blas_for`` raises
    it for big GEMMs) and ``threads`` workers for the kernels, both restored on exit. A plain
    class rather than stacked context managers: it is entered once per run, which for a
    small model is a few tens of microseconds."""

    __slots__ = ("threads", "saved")

    def __init__(self, threads: int):
        self.threads = max(1, int(threads))

    def __enter__(self) -> RunThreads:
        global _active_runs
        with _runs_lock:
            _active_runs += 1
        if _blas_at_one is not True:
            _keep_blas_at_one()
        self.saved = workers()
        _state.workers = self.threads
        return self

    def __exit__(self, *exc_info) -> None:
        global _active_runs
        _state.workers = self.saved
        with _runs_lock:
            _active_runs -= 1


# BLAS's thread count is process-wide. Runs keep it at one thread (``blas_for`` raises it for a
# big GEMM while a run is alone), and it stays there between runs as long as an executable
# that runs this way is alive (``hold_blas`` / ``release_blas``): setting it back to two after
# every run woke OpenBLAS's pool each time, and runs in several threads then fought over it, as
# do two callers of a multi-threaded OpenBLAS. With BLAS kept at one thread, two executables in
# two Python threads take 35-41 ms against 56-62 ms one after another (2 cores;
# ``benchmarks/bench_timing_effects.py --only concurrent``).
_runs_lock = threading.RLock()  # re-entrant: release_blas runs from weakref finalizers, which GC may call while it is held
_active_runs = 0  # runs in progress, over all threads
_holders = 0  # live executables that run with threads=
_saved_blas: list[int] = []
_blas_at_one: bool | None = None


def _keep_blas_at_one() -> None:
    global _blas_at_one
    for library in _blas_libraries():
        library.set_num_threads(1)
    _blas_at_one = True


def hold_blas() -> None:
    """An executable that runs with ``threads=`` is alive: BLAS is this backend's until released."""
    global _holders, _saved_blas
    with _runs_lock:
        if _holders == 0:
            _saved_blas = [library.num_threads for library in _blas_libraries()]
        _keep_blas_at_one()  # also when someone else has raised it since
        _holders += 1


def release_blas() -> None:
    """The last such executable is gone: BLAS gets back the thread count it had before."""
    global _holders, _blas_at_one
    with _runs_lock:
        _holders -= 1
        if _holders == 0:
            for library, count in zip(_blas_libraries(), _saved_blas):
                library.set_num_threads(count)
            _blas_at_one = None


# GEMMs from this many multiply-adds on (half a millisecond and more on one thread: the
# encoder's 33.5M FFN GEMMs; ResNet-50's convs at 51M and up) get the run's threads in BLAS.
# Our own row blocks on Python threads do not pay at this size: that FFN GEMM took 0.58 ms on
# one BLAS thread, 0.50 on two and 0.78 in two row blocks on two Python threads (GIL hand-offs
# and a helper's wake-up; ``bench_timing_effects.py --only blas``). Lowering this from 40M to
# 30M, with the 4M-element floor on split elementwise work below, took the encoder block from
# 3.25-3.34x onnxruntime's time to 2.34-2.54x (``bench_backends.py``). Smaller GEMMs
# stay on one BLAS thread: a BLAS helper that has lost its core stalls the whole call for a
# time slice, and OpenBLAS's workers spin for ~120 ms of CPU after each multi-threaded call.
BLAS_SPLIT_MACS = 30_000_000


@functools.cache
def _blas_libraries() -> tuple:
    from threadpoolctl import ThreadpoolController

    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


_NO_CHANGE = contextlib.nullcontext()


def blas_for(macs: int) -> contextlib.AbstractContextManager:
    """Inside a run with several workers, a context giving BLAS the run's threads for a GEMM
    of ``macs`` multiply-adds worth it (the run itself keeps BLAS at one thread); a shared
    no-op context otherwise, so small GEMMs pay next to nothing for asking."""
    count = workers()
    if count <= 1 or macs < BLAS_SPLIT_MACS or _active_runs > 1:  # never while another run is in BLAS
        return _NO_CHANGE
    return _blas_threads(count)


@contextlib.contextmanager
def _blas_threads(count: int) -> Iterator[None]:
    libraries = _blas_libraries()
    for library in libraries:
        library.set_num_threads(count)
    try:
        yield
    finally:
        for library in libraries:
            library.set_num_threads(1)


def _helpers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                                       thread_name_prefix="edgeinfer-numpy")
        return _pool


# Work below this many elements runs on the calling thread alone. Two Python threads running
# numpy ufuncs hand the GIL back and forth at every call, and on this 2-core VM that costs more
# than it saves until the work is large: GELU on a 128x1024 block, cut in 2/4/8 chunks, took
# 720/740/797 us on one thread and 850/1092/1384 us shared with a helper
# (``bench_timing_effects.py --only ufunc_threads``); the encoder block then ran slower at
# threads=2 than at threads=1 (3.70 against 3.38 ms). Depthwise blocks of the big maps and
# ResNet-50's epilogues are still above it.
_MIN_PARALLEL_WORK = 1 << 22


def parallel_for(count: int, body: Callable[[int], None], *, work: int | None = None) -> None:
    """``body(i)`` for every ``i`` in ``range(count)``, shared with up to ``workers() - 1``
    helper threads when ``work`` (elements touched, if given) is worth it. Returns when
    every chunk is done; re-raises the first chunk's error."""
    helpers = min(workers(), count) - 1
    if work is not None and work < _MIN_PARALLEL_WORK:
        helpers = 0
    if helpers <= 0:
        for index in range(count):
            body(index)
        return
    lock = threading.Lock()
    finished = threading.Event()
    state = {"next": 0, "done": 0}
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                index = state["next"]
                if index >= count:
                    return
                state["next"] = index + 1
            try:
                body(index)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                errors.append(exc)
            with lock:
                state["done"] += 1
                if state["done"] == count:
                    finished.set()

    pool = _helpers()
    for _ in range(helpers):
        pool.submit(work)
    work()
    finished.wait()
    if errors:
        raise errors[0]


def chunks_for(elements: int, chunk_elements: int) -> int:
    """How many chunks of about ``chunk_elements`` to cut ``elements`` of elementwise work
    into: small enough that a chunk's operands and scratch stay in cache through all its
    passes (a cheap per-chunk step wants bigger chunks than a thirty-pass one), at least one."""
    return max(1, -(-elements // chunk_elements))


def split(total: int, parts: int, *, align: int = 1) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``range(total)`` in about ``parts`` pieces, each start
    a multiple of ``align`` (so chunks stay aligned to cache lines or SIMD widths)."""
    parts = max(1, min(parts, -(-total // align)))
    step = -(-total // parts)
    step = -(-step // align) * align
    return [(start, min(start + step, total)) for start in range(0, total, step)]
