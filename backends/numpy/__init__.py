"""The numpy reference backend: one kernel per op, liveness-planned memory."""

from edgeinfer.backends.numpy import kernels  # noqa: F401  (registers every kernel)
from edgeinfer.backends.numpy.executor import NumpyBackend, NumpyExecutable
from edgeinfer.backends.numpy.registry import KERNELS, kernel


def create_backend(**options) -> NumpyBackend:
    if options:
        from edgeinfer.errors import BackendError

        raise BackendError(f"numpy backend takes no engine options, got {sorted(options)}")
    return NumpyBackend()


__all__ = ["NumpyBackend", "NumpyExecutable", "KERNELS", "kernel", "create_backend"]
