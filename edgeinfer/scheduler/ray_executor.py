"""Moved to ``edgeinfer.runtime.ray``; this name stays importable (the same module object)."""

import sys

from edgeinfer.runtime import ray as _moved

sys.modules[__name__] = _moved
