"""The numpy reference backend: one kernel per op, liveness-planned memory."""

import logging

from edgeinfer.backends.numpy import kernels  # noqa: F401  (registers every kernel)
from edgeinfer.backends.numpy.executor import NumpyBackend, NumpyExecutable
from edgeinfer.backends.numpy.registry import KERNELS, kernel

log = logging.getLogger("edgeinfer.backends.numpy")


def create_backend(*, device: str = "cpu", fallback: bool = False, **options) -> NumpyBackend:
    from edgeinfer.errors import BackendError

    if options:
        raise BackendError(f"numpy backend takes no engine options, got {sorted(options)}")
    if device != "cpu":
        if not fallback:
            raise BackendError(f"numpy backend runs on the CPU only, device {device!r} was requested "
                               "(fallback=True runs it on the CPU)")
        log.warning("numpy backend: device %r is not available, running on the CPU", device)
    return NumpyBackend()


__all__ = ["NumpyBackend", "NumpyExecutable", "KERNELS", "kernel", "create_backend"]
