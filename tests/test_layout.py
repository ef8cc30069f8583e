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


def _runtime_modules() -> dict[str, Path]:
    modules = {}
    for path in (ROOT / "edgeinfer" / "runtime").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _runtime_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The runtime modules ``path`` imports anywhere (function-local imports too: a cycle
    broken by a late import is still a cycle). ``from package import module`` counts as the
    module, not the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
            found |= submodules if len(submodules) == len(node.names) else {node.module, *submodules}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found & modules.keys()


def test_the_runtime_is_one_package_without_import_cycles():
    """``edgeinfer/runtime`` holds placement, executors and streams; the old ``scheduler``
    package and the ``edgeinfer.session`` stand-in are gone, and nothing imports them."""
    assert not (ROOT / "edgeinfer" / "scheduler").exists() and not (ROOT / "edgeinfer" / "session.py").exists()
    stale = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p)
                                              if m.startswith(("edgeinfer.scheduler", "edgeinfer.session")))
             for folder in (*LIBRARY, ROOT / "tests", ROOT / "benchmarks", ROOT / "models") for p in folder.rglob("*.py")}
    assert not {k: v for k, v in stale.items() if v}
    modules = _runtime_modules()
    graph = {name: _runtime_imports(path, modules) - {name} for name, path in modules.items()}
    cycles = []
    for start in graph:  # depth-first search for a path back to ``start``
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(path + [start])
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert not cycles, f"import cycles in edgeinfer/runtime: {cycles[:3]}"


def test_the_runtime_stays_small_enough_to_read():
    """No file in ``edgeinfer/runtime`` over 400 lines, no function over 80, and
    ``Session.__init__`` takes at most 8 parameters (the rest are option objects)."""
    long_files, long_functions = {}, {}
    for path in (ROOT / "edgeinfer" / "runtime").rglob("*.py"):
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        if text.count("\n") > 400:
            long_files[name] = text.count("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long_functions[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert not long_files and not long_functions, (long_files, long_functions)
    import inspect

    from edgeinfer.runtime.session import Session

    assert len(inspect.signature(Session.__init__).parameters) - 1 <= 8  # past self: model, backend, threads, ...; **engine_options


def test_only_one_function_of_the_library_calls_backend_compile():
    """``Backend.compile`` is called in ``runtime.parts.engine_compile`` (and by constant folding,
    which runs single nodes on the numpy reference), nowhere else in the library."""
    callers = []
    for path in library_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "compile" \
                        and "backend" in ast.unparse(call.func.value).lower():
                    callers.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert sorted(set(callers)) == ["edgeinfer/passes/fold_constants.py:_evaluate",
                                    "edgeinfer/runtime/parts.py:engine_compile"], callers
