"""Package layout: ``converters/`` and ``backends/`` install as ``edgeinfer.converters`` and
``edgeinfer.backends``, so the wheel puts nothing but ``edgeinfer`` into site-packages.
(pyproject.toml cannot express a renamed sub-tree with package discovery.)"""

from setuptools import find_packages, setup

ROOTS = {"edgeinfer": "edgeinfer", "edgeinfer.converters": "converters", "edgeinfer.backends": "backends"}


def packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return sorted(set(found))


setup(packages=packages(), package_dir=ROOTS)
