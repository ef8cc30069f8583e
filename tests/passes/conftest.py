"""Make ``passcheck`` (the shared rewrite checks) importable: with ``--import-mode=importlib``
pytest puts no test folder on ``sys.path``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
