"""``relayrl --help`` as a newcomer first reads it: every command's row says its summary as one
paragraph, wrapped to the terminal, not broken where its docstring's lines happened to end."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from commands.cli import app


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_each_commands_summary_is_one_row_on_a_wide_terminal(argv):
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "2000", "NO_COLOR": "1"}, terminal_width=2000)
    assert result.exit_code == 0, result.output
    panel = result.output.split("─ Commands ─")[1].split("╰")[0].splitlines()[1:]
    assert len(panel) > 5
    # A row that goes on below its command's name is a docstring's line break (rich keeps them).
    continued = [line.strip("│ ") for line in panel if line.startswith("│  ")]
    assert not continued, continued
