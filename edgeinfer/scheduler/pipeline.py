"""Moved to ``edgeinfer.runtime.pipeline``; this name stays importable (the same module object)."""

import sys

from edgeinfer.runtime import pipeline as _moved

sys.modules[__name__] = _moved
