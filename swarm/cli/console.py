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
        args = expand_multi_value_option(sys.argv[1:])
        status = command.main(args=args, prog_name=name, standalone_mode=False)
    except click.exceptions.Exit as done:
        status = done.exit_code
    except click.ClickException as error:
        _fail(name, error.format_message(), error.exit_code)
    except SwarmError as error:
        _fail(name, str(error), EXIT_USER_ERROR)
    except (KeyboardInterrupt, click.Abort):
        _fail(name, "interrupted", EXIT_INTERRUPTED)
    sys.exit(status if isinstance(status, int) else 0)


class DefaultCommandGroup(click.Group):
    """A group of commands whose first one runs when the first argument names none of them: a
    program that grew subcommands (`swarm-bootstrap invite`) keeps its old command line."""

    def parse_args(self, context: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in context.help_option_names):
            args = [next(iter(self.commands)), *args]
        return super().parse_args(context, args)


def _fail(name: str, message: str, status: int) -> None:
    one_line = " ".join(message.split())
    sys.stderr.write(f"{name}: error: {one_line}\n")
    sys.stderr.flush()
    sys.exit(status)


def expand_multi_value_option(args: list[str], option: str = "--initial-peers") -> list[str]:
    """Let `--initial-peers A B C` mean `--initial-peers A --initial-peers B --initial-peers C`.

    click options take one value each; only the multiaddrs (arguments starting with '/')
    right after the option are taken, so a positional argument after them is left alone.
    """
    expanded, i = [], 0
    while i < len(args):
        expanded.append(args[i])
        if args[i] == option and i + 1 < len(args):
            expanded.append(args[i + 1])
            i += 2
            while i < len(args) and args[i].startswith("/"):
                expanded += [option, args[i]]
                i += 1
            continue
        i += 1
    return expanded
