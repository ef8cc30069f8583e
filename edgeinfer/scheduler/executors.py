"""Moved to ``edgeinfer.runtime.executors``; this name stays importable (the same module object)."""

import sys

from edgeinfer.runtime import executors as _moved

sys.modules[__name__] = _moved
