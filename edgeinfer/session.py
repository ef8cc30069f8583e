"""Moved to ``edgeinfer.runtime.session``; this name stays importable (the same module object)."""

import sys

from edgeinfer.runtime import session as _moved

sys.modules[__name__] = _moved
