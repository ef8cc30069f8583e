"""Compiled plans, one per shape signature, and the bounded cache that owns them.

A ``CompiledPlan`` is everything compiled or measured for one signature: the backends, the
partition (``Plan``), the executor running it, auto's choice and the executor choice, and the
stream stage plans planned for it. It owns them: ``close()`` closes every compiled object it
holds (parts, replicas, stage plans), so nothing compiled stays alive once it is gone.

``PlanCache`` is a locked, bounded LRU of such owners. Two threads asking for the same
missing key build it once (the second waits); an entry pushed out is *retired*: closed at once
if nobody is using it, else when its last user releases it (a stream or a run in progress
keeps what it runs on).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from contextlib import contextmanager
from typing import Any

from edgeinfer.errors import SchedulerError
from edgeinfer.ir import Graph
from edgeinfer.log import get_logger
from edgeinfer.runtime.feeds import Signature

log = get_logger("edgeinfer.runtime.plans")


class Owned:
    """Something that closes what it compiled, once nobody uses it: ``acquire``/``release``
    around each use, ``retire`` when it should go (it closes when the last user is done)."""

    def __init__(self) -> None:
        self._owner_lock = threading.Lock()
        self._users = 0
        self._retired = False
        self.closed = False

    @property
    def retired(self) -> bool:
        """Whether it was told to go (it closes when its last user releases it)."""
        return self._retired or self.closed

    def acquire(self) -> None:
        with self._owner_lock:
            if self.closed:
                raise SchedulerError(f"{type(self).__name__} is closed: expected an open one")
            self._users += 1

    def release(self) -> None:
        with self._owner_lock:
            self._users -= 1
            now = self._retired and self._users == 0 and not self.closed
        if now:
            self.close()

    def retire(self) -> None:
        with self._owner_lock:
            self._retired = True
            now = self._users == 0 and not self.closed
        if now:
            self.close()

    def close(self) -> None:
        with self._owner_lock:
            if self.closed:
                return
            self.closed = True
        self._close()

    def _close(self) -> None:
        """Close what this owner compiled (subclasses)."""


def retire(value: Any) -> None:
    if isinstance(value, Owned):
        value.retire()
    elif hasattr(value, "close"):
        value.close()


class PlanCache:
    """A locked, bounded LRU of owners; evicted ones are retired (closed when unused)."""

    def __init__(self, capacity: int = 8):
        if not isinstance(capacity, int) or capacity < 1:
            raise SchedulerError(f"plan cache capacity {capacity!r}: expected a positive integer")
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._building: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.built = 0  # entries built so far
        self.evicted: list[Hashable] = []  # keys pushed out, oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._entries)

    def values(self) -> list[Any]:
        with self._lock:
            return list(self._entries.values())

    def peek(self, key: Hashable) -> Any:
        with self._lock:
            return self._entries.get(key)

    def get(self, key: Hashable, build: Callable[..., Any], *args: Any) -> Any:
        """The entry for ``key``, built by ``build(*args)`` the first time (once, whoever asks)."""
        while True:
            with self._lock:
                if self._closed:
                    raise SchedulerError("plan cache is closed")
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key]
                pending = self._building.get(key)
                if pending is None:
                    pending = self._building[key] = threading.Event()
                    break
            pending.wait()  # another thread builds it; then look again (it may have failed)
        try:
            value = build(*args)
        except BaseException:
            with self._lock:
                del self._building[key]
            pending.set()
            raise
        evicted = []
        with self._lock:
            del self._building[key]
            if self._closed:
                evicted.append(value)
            else:
                self._entries[key] = value
                self.built += 1
                while len(self._entries) > self.capacity:
                    old_key, old = self._entries.popitem(last=False)
                    self.evicted.append(old_key)
                    evicted.append(old)
        pending.set()
        for old in evicted:
            retire(old)
        if self._closed:
            raise SchedulerError("plan cache closed while a plan was being built")
        return value

    def acquire(self, key: Hashable, build: Callable[..., Any], *args: Any) -> Any:
        """The entry for ``key``, acquired: the caller must ``release()`` it when done."""
        while True:
            with self._lock:  # a hit (the steady case) takes no further call
                value = self._entries.get(key)
                if value is not None:
                    self._entries.move_to_end(key)
            if value is None:
                value = self.get(key, build, *args)
            try:
                value.acquire()
            except SchedulerError:  # evicted and closed between get and acquire: build again
                if self._closed:
                    raise
                continue
            return value

    @contextmanager
    def lease(self, key: Hashable, build: Callable[..., Any], *args: Any):
        """``with cache.lease(key, build, *args) as value``: the entry, kept open while in use."""
        value = self.acquire(key, build, *args)
        try:
            yield value
        finally:
            value.release()

    def close(self) -> None:
        """Retire every entry (each closes once its users are done)."""
        with self._lock:
            self._closed = True
            entries = list(self._entries.values())
            self._entries.clear()
        for value in entries:
            retire(value)


class EngineSettings:
    """What a session asks of its plans (everything but the shapes)."""

    def __init__(self, backend: Any, executor: str, threads: int | None = None, device: str = "cpu",
                 fallback: bool = False, options: dict[str, dict[str, Any]] | None = None, debug: bool = False,
                 cache: Any = None, plan_cache_size: int = 8, compiled: Any = None,
                 auto_budget: float | None = None, precision: Any = None) -> None:
        self.backend = backend  # "auto", a name, a Backend, or a priority list
        self.executor = executor  # sequential | dag | auto | ray
        self.threads = threads
        self.device = device
        self.fallback = fallback
        self.options: dict[str, dict[str, Any]] = {} if options is None else options
        self.debug = debug
        self.cache = cache  # auto's disk cache folder (None: the default, False: off)
        self.plan_cache_size = plan_cache_size
        self.compiled = compiled  # the compiled section of an .eim this session runs (``aot``)
        self.auto_budget = auto_budget  # seconds auto's timing rounds take together (None: the default)
        self.precision = precision  # options.PrecisionOptions (None: fp32)
        self.samples: list[dict[str, Any]] | None = None  # checked real inputs a reduced precision is checked on

    @property
    def measured_precision(self) -> str:
        """The precision auto decides on ("fp32": none to decide)."""
        return "fp32" if self.precision is None else self.precision.precision

    @property
    def per_signature(self) -> bool:
        """Whether anything is measured, so each signature decides on its own."""
        return self.compiled is None and (self.backend == "auto" or self.executor == "auto"
                                          or self.measured_precision != "fp32")


class CompiledPlan(Owned):
    """One signature's backends, partition, executor and stream plans; closes all of them."""

    def __init__(self, signature: Signature | None, settings: EngineSettings, graph: Graph, backends: list,
                 plan: Any, runner: Any, executor: str, *, executor_ms: Mapping[str, float] | None = None,
                 auto_choice: Any = None, prove: bool = True):
        super().__init__()
        self.signature = signature  # None: one plan serves every signature
        self.settings = settings
        self.graph = graph
        self.backends = backends
        self.plan = plan
        self.runner = runner  # None with executor="ray" (the actors run the stages)
        self.executor = executor
        self.executor_ms = dict(executor_ms or {})
        self.auto_choice = auto_choice
        self.stage_plans = PlanCache(settings.plan_cache_size)
        self.repartitions: list[str] = []  # what moved to another backend, and why
        self.excluded: dict[int, dict[str, str]] = {}  # node -> {backend: why it failed there}
        self.proven = False  # a request has run on it (no re-partition is due any more)
        self.section: Any = None  # the compiled .eim section it was built from (``aot``), if any
        self.proving = threading.Lock()
        if runner is None:
            self.run = self._no_runner
        elif prove:
            self.run = self._first_run
        else:  # runs already proved it (auto ran the candidate it compiled while measuring)
            self.proved()

    @property
    def threads(self) -> int | None:
        return self.settings.threads

    # ``run(feeds)``: checked feeds in, outputs out. One callable, replaced once: the first
    # requests go through the re-partition (``fallback.run_proving``); from the first success on,
    # ``run`` is the runner's own (for one part that is the whole graph, the engine's ``run``).
    def _first_run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        from edgeinfer.runtime.fallback import run_proving  # a compiled file's load never needs it

        return run_proving(self, feeds)

    def proved(self) -> None:
        self.run = self.runner.run
        self.proven = True

    def _no_runner(self, feeds: dict[str, Any]) -> dict[str, Any]:
        raise SchedulerError("this plan has no local runner (executor='ray' runs on its actors)")

    def stage_plan(self, key: Hashable, build: Callable[[], Any]) -> Any:
        return self.stage_plans.get(key, build)

    @property
    def precision_record(self) -> dict[str, Any] | None:
        """What this plan computes in, as decided (the compiled section's, auto's; None: not decided)."""
        return getattr(self.section, "precision", None) or (
            self.auto_choice.precision_record() if self.auto_choice is not None else None)

    def describe(self) -> str:
        text = self.plan.describe()
        if self.section is not None:
            from edgeinfer.runtime.aot import describe

            text += "\n" + "\n".join(describe(self.section))
        record = self.precision_record
        if record:
            from edgeinfer.runtime.precision import describe as precision_lines

            text += "".join(f"\n{line}" for line in precision_lines(record))
        if self.repartitions:
            text += "\nre-partitioned:\n" + "\n".join(f"  {line}" for line in self.repartitions)
        return text

    def _close(self) -> None:
        self.run = self._closed_run
        self.stage_plans.close()
        if self.runner is not None:
            self.runner.close()

    def _closed_run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        raise SchedulerError("this plan is closed: its session was closed or it was evicted")


def build_plan(model: Any, settings: EngineSettings, signature: Signature | None,
               feeds: Mapping[str, Any] | None) -> CompiledPlan:
    """Decide and compile the plan of one signature: ``backend="auto"`` and ``executor="auto"``
    are measured on ``feeds`` (real feeds of that signature); otherwise nothing depends on the
    shapes and ``signature`` is None. What auto compiled while measuring is reused when it is
    what this plan runs, and closed otherwise (never two compiled models alive for one plan)."""
    from edgeinfer.runtime import placement

    graph = model.graph
    executor = settings.executor
    local = "sequential" if executor == "ray" else executor  # Ray: the actors compile the stages
    auto_choice = None
    if settings.backend == "auto" or settings.measured_precision != "fp32":
        from edgeinfer.runtime.auto import choose_backends
        from edgeinfer.runtime.options import PrecisionOptions

        precision = settings.precision or PrecisionOptions()
        lists = None if settings.backend == "auto" else \
            [[b if isinstance(b, str) else b.name for b in placement.backend_priority(settings.backend)]]
        auto_choice = choose_backends(model, feeds, threads=settings.threads, device=settings.device,
                                      fallback=settings.fallback, options=settings.options, cache=settings.cache,
                                      signature=signature, budget_s=settings.auto_budget,
                                      precision=precision.precision, samples=settings.samples,
                                      tolerance=precision.tolerance, lists=lists)
        names = auto_choice.backends
        prepared, auto_choice.prepared = auto_choice.prepared, None
        if prepared is not None:
            if local == "sequential" and not settings.debug:
                backends, plan, runner = prepared  # compiled while measuring
                compiled = CompiledPlan(signature, settings, graph, backends, plan, _local(runner, executor), executor,
                                        auto_choice=auto_choice, prove=False)
                compiled.repartitions.extend(auto_choice.repartitions.get(",".join(names), []))
                return compiled
            prepared[2].close()
    else:
        names = placement.backend_priority(settings.backend)
    chosen = {} if auto_choice is None else auto_choice.options  # a reduced precision's engine options
    options = {k: {**settings.options.get(k, {}), **chosen.get(k, {})} for k in {*settings.options, *chosen}}
    backends = placement.make_backends(names, device=settings.device, fallback=settings.fallback, options=options)
    executor_ms: dict[str, float] = {}
    notes: list[str] = []
    excluded: dict[int, dict[str, str]] = {}
    if executor == "auto":
        from edgeinfer.runtime.auto import choose_executor

        executor, plan, runner, executor_ms = choose_executor(model, backends, feeds, threads=settings.threads,
                                                              debug=settings.debug)
    elif executor == "ray":
        plan, runner = placement.make_plan(graph, backends), None
    else:
        from edgeinfer.runtime.compile import compile

        plan, runner = compile(graph, backends, executor=local, threads=settings.threads,
                               debug=settings.debug, excluded=excluded, notes=notes)
    compiled = CompiledPlan(signature, settings, graph, backends, plan, runner, executor,
                            executor_ms=executor_ms, auto_choice=auto_choice)
    compiled.repartitions.extend(notes)
    compiled.excluded = excluded
    if auto_choice is None:
        warn_if_unused(plan, [b.name for b in backends])
    return compiled


class ReferenceFallbackWarning(UserWarning):
    """The backends a caller named took none of the model's nodes: it all runs on numpy."""


def warn_if_unused(plan: Any, names: list[str]) -> None:
    """Say it when every node of a model fell back to the numpy reference although the caller
    named other engines (a quiet fallback would hide that the engine was never used)."""
    from edgeinfer.runtime.placement import REFERENCE

    named = [name for name in names if name != REFERENCE]
    if not named or not plan.parts or any(part.backend != REFERENCE for part in plan.parts):
        return
    reasons: dict[str, int] = {}
    for declined in plan.assignment.declined.values():
        for name in named:
            if name in declined:
                reason = f"{name}: {declined[name]}"
                reasons[reason] = reasons.get(reason, 0) + 1
    top = "; ".join(f"{reason} (x{count})" if count > 1 else reason
                    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
    warnings.warn(f"backend {', '.join(named)} took none of the model's {len(plan.assignment.backends)} nodes: "
                  f"everything runs on the numpy reference ({top or 'every part failed there'})",
                  ReferenceFallbackWarning, stacklevel=4)


def _local(runner: Any, executor: str) -> Any:
    """With Ray no local runner is kept (the actors compile and run the stages)."""
    if executor == "ray":
        runner.close()
        return None
    return runner
