"""Moved to ``edgeinfer.runtime.auto``; this name stays importable (the same module object)."""

import sys

from edgeinfer.runtime import auto as _moved

sys.modules[__name__] = _moved
