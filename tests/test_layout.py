"""The package layout: the wheel holds ``edgeinfer`` only, the library never imports its command
line, and the repository's own tools (``devkit``) stay out of both."""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = [ROOT / "edgeinfer", ROOT / "converters", ROOT / "backends"]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def library_files() -> list[Path]:
    cli = ROOT / "edgeinfer" / "cli"
    return [p for folder in LIBRARY for p in folder.rglob("*.py") if cli not in p.parents]


def test_library_imports_neither_the_cli_nor_devkit():
    offenders = {}
    for path in library_files():
        bad = sorted(m for m in imported_modules(path)
                     if m == "edgeinfer.cli" or m.startswith(("edgeinfer.cli.", "devkit")))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders, f"library modules import the command line or devkit: {offenders}"


def test_wheel_packages_are_edgeinfer_only(monkeypatch):
    import setuptools

    arguments: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: arguments.update(kwargs))  # read, build nothing
    runpy.run_path(str(ROOT / "setup.py"))
    packages = arguments["packages"]
    assert "edgeinfer.cli" in packages
    assert all(name == "edgeinfer" or name.startswith("edgeinfer.") for name in packages), packages
