"""edgeinfer's loggers, made when first used.

Importing :mod:`logging` costs about 9 ms of a cold start on a small core, and a model loaded for a
device logs nothing unless something goes wrong, so the modules a compiled model loads through
hold a :class:`Logger` that imports :mod:`logging` and fetches the real logger on its first call.
The real logger is the one ``logging.getLogger(name)`` returns, so handlers, levels and pytest's
``caplog`` behave as usual.
"""

from __future__ import annotations

from typing import Any


class Logger:
    __slots__ = ("name", "_real")

    def __init__(self, name: str) -> None:
        self.name = name
        self._real: Any = None

    def __getattr__(self, attr: str) -> Any:  # only for what the slots lack: warning, debug, ...
        real = self._real
        if real is None:
            import logging

            real = self._real = logging.getLogger(self.name)
        return getattr(real, attr)

    def __repr__(self) -> str:
        return f"<edgeinfer.log.Logger {self.name}>"


def get_logger(name: str) -> Logger:
    return Logger(name)
