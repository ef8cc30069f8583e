"""The CLI contract on bad input: one line on stderr starting with 'error:', exit status 2."""

from __future__ import annotations

from click.testing import CliRunner


def cli_fails(args: list, message: str | None = None) -> str:
    """Run the CLI in-process; assert one line on stderr starting with 'error:', exit status 2."""
    from edgeinfer.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    if message is not None:
        assert message in lines[0], lines[0]
    return lines[0]
