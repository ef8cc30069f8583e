"""Graph optimization passes. Every module in this package registers its passes with
``@graph_pass``; ``optimize`` runs them in the order of ``PIPELINE_ORDER`` (manager.py)."""

import importlib
import pkgutil

from edgeinfer.passes.manager import (
    PIPELINE,
    PIPELINE_ORDER,
    PassReport,
    PassResult,
    get_pass,
    graph_pass,
    optimize,
    run_pass,
)

_LOADED = False
_HELPERS = {"manager", "rules"}


def load_all() -> None:
    """Import every pass module once (each registers itself)."""
    global _LOADED
    if _LOADED:
        return
    importlib.import_module("edgeinfer.ir.lowering")  # type rules of the edgeinfer-domain ops
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name not in _HELPERS:
            importlib.import_module(f"{__name__}.{module.name}")
    _LOADED = True


__all__ = ["PIPELINE", "PIPELINE_ORDER", "PassReport", "PassResult", "get_pass", "graph_pass",
           "optimize", "run_pass", "load_all"]
