"""The ``.eim`` model file: ``save_model`` writes one atomically, ``load_model`` maps one.

See ``edgeinfer.format.eim`` for the byte layout and ``edgeinfer.format.document`` for the
JSON encoding of graphs. The names below load ``eim`` on first use (PEP 562): a device reading a
compiled file for its plan (``format.lean``) imports the reading half alone (``format.reading``).
"""

from importlib import import_module
from typing import Any

__all__ = ["save_model", "load_model", "FORMAT_VERSION", "MAGIC"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'edgeinfer.format' has no attribute {name!r}")
    return getattr(import_module("edgeinfer.format.eim"), name)
