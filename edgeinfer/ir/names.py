"""Fresh value and node names: the one helper converters, passes, lowerings and the quantizer
share when they add values to a graph."""

from __future__ import annotations


def fresh_name(base: str, taken: set[str], *, sep: str = "_", first: int = 1) -> str:
    """``base`` if unused, else ``base{sep}{n}`` for the first free n >= ``first``; the
    returned name is added to ``taken``."""
    name, index = base, first
    while name in taken:
        name = f"{base}{sep}{index}"
        index += 1
    taken.add(name)
    return name
