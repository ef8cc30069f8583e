"""Versioned registries keyed by ``(domain, op_type, since)``.

Kernels, converter rules and quantizers are all registered by decorator into an
``OpRegistry``. A lookup for opset version V resolves to the entry with the greatest
``since`` not above V. Registering the same key twice is an error, so two modules cannot
silently fight over an op.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class OpRegistry(Generic[T]):
    def __init__(self, what: str):
        self.what = what
        self._entries: dict[tuple[str, str], list[tuple[int, T]]] = {}

    def register(self, op_type: str, item: T, *, domain: str = "", since: int = 1) -> T:
        versions = self._entries.setdefault((domain, op_type), [])
        if any(v == since for v, _ in versions):
            op = f"{domain}::{op_type}" if domain else op_type
            raise ValueError(f"duplicate {self.what} for {op} since opset {since}")
        bisect.insort(versions, (since, item), key=lambda entry: entry[0])
        return item

    def decorator(self, op_type: str | tuple[str, ...], *, domain: str = "", since: int = 1) -> Callable[[T], T]:
        names = (op_type,) if isinstance(op_type, str) else op_type

        def register(item: T) -> T:
            for name in names:
                self.register(name, item, domain=domain, since=since)
            return item

        return register

    def lookup(self, op_type: str, *, domain: str = "", version: int | None = None) -> T | None:
        """The entry with the greatest ``since`` <= ``version`` (newest if version is None)."""
        versions = self._entries.get((domain, op_type))
        if not versions:
            return None
        if version is None:
            return versions[-1][1]
        index = bisect.bisect_right([v for v, _ in versions], version)
        return versions[index - 1][1] if index else None

    def since_versions(self, op_type: str, *, domain: str = "") -> list[int]:
        return [v for v, _ in self._entries.get((domain, op_type), [])]

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._entries

    def keys(self) -> Iterator[tuple[str, str]]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)
