"""Helpers shared by tests that run the installed command-line programs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from swarm.lab.launch import command_path

COMMAND_TIMEOUT_S = 240


def run_command(
    name: str, *args: str, cwd: Path | None = None, timeout: float = COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [command_path(name), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Non-zero exit, no traceback, and one error line on stderr that names the problem."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
