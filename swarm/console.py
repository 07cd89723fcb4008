"""What every command-line program shares: logging set-up and one-line errors.

A user error (ours, or a bad option caught by click) becomes one line on stderr and a
non-zero exit status, never a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import sys

import click

from swarm.errors import SwarmError

EXIT_USER_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def run_command(command: click.Command) -> None:
    """Run a click command as a program and exit with its status."""
    setup_logging()
    name = command.name or "swarm"
    try:
        status = command.main(prog_name=name, standalone_mode=False)
    except click.exceptions.Exit as done:
        status = done.exit_code
    except click.ClickException as error:
        _fail(name, error.format_message(), error.exit_code)
    except SwarmError as error:
        _fail(name, str(error), EXIT_USER_ERROR)
    except (KeyboardInterrupt, click.Abort):
        _fail(name, "interrupted", EXIT_INTERRUPTED)
    sys.exit(status if isinstance(status, int) else 0)


def _fail(name: str, message: str, status: int) -> None:
    one_line = " ".join(message.split())
    sys.stderr.write(f"{name}: error: {one_line}\n")
    sys.stderr.flush()
    sys.exit(status)
