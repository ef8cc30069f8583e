"""Graph optimization passes. Every module in this package registers its passes with
``@graph_pass``; ``optimize`` runs the pipeline."""

import importlib
import pkgutil

from edgeinfer.passes.manager import PIPELINE, PassReport, PassResult, graph_pass, optimize

_LOADED = False


def load_all() -> None:
    """Import every pass module once (each registers itself)."""
    global _LOADED
    if _LOADED:
        return
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name != "manager":
            importlib.import_module(f"{__name__}.{module.name}")
    _LOADED = True


__all__ = ["PIPELINE", "PassReport", "PassResult", "graph_pass", "optimize", "load_all"]
