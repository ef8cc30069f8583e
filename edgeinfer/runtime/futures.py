"""Futures for ``run_async`` and the executors, importing :mod:`concurrent.futures` when first
used: a model loaded to answer once (a device's cold start) needs none, and the import costs about
10 ms there."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future


def settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless it is already done (closing and finishing may race)."""
    from concurrent.futures import InvalidStateError

    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def chain(future: Future, then: Callable[[Any], Any]) -> Future:
    """A future of ``then(result)`` of ``future``."""
    from concurrent.futures import Future

    chained: Future = Future()

    def done(source: Future) -> None:
        try:
            settle(chained, result=then(source.result()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            settle(chained, error=exc)

    future.add_done_callback(done)
    return chained
