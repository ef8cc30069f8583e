"""The repository's own tools, not shipped in the wheel (setup.py installs ``edgeinfer`` only):

- ``zoo``: reference architectures (ONNX built in code) that tests and benchmarks run;
- ``testing``: the numeric oracle ``assert_close`` and ``parse_model`` for test graphs;
- ``docs``: regenerates the tables in ``docs/`` from the registries (``python -m devkit.docs``).

Tests find it through pytest's ``pythonpath``; scripts in ``benchmarks/`` and ``models/`` put
the repository root on ``sys.path`` first.
"""
