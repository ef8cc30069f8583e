"""PyTorch models of the corpus: TorchScript files and state dicts with their module code."""

from __future__ import annotations

from .checks import RealModel

MODELS: list[RealModel] = []
