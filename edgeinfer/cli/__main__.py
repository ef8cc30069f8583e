"""``python -m edgeinfer.cli``: the same as the ``edgeinfer`` command."""

from edgeinfer.cli.commands import main

main()
