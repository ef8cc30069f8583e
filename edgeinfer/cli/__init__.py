"""The ``edgeinfer`` command line: the click commands and what only they use.

- ``commands``: the click group and its commands (``edgeinfer = edgeinfer.cli:main``);
- ``support``: one-line errors, the options every command shares;
- ``bench`` (measurements), ``tables`` (what ``bench`` prints), ``peers`` (raw engines),
  ``memory`` (peak RSS): ``edgeinfer bench``;
- ``parity``: ``convert --verify`` against the source framework (the IR's own invariants are
  ``edgeinfer.ir.verify``);
- ``graphview``: ``inspect --dot/--html``; ``quantize``: the quantize options and command;
  ``progress``: progress bars on stderr.

The library never imports this package.
"""

from edgeinfer.cli.commands import main

__all__ = ["main"]
