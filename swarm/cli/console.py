"""What every command-line program shares: logging set-up, one-line errors, and click's conventions.

A user error (ours, or a bad option caught by click) becomes one line on stderr and a
non-zero exit status, never a traceback. Anything else is a bug and keeps its traceback.
Every command takes `-h`, `--version` and `--log-level`, and its help ends with the exit codes
(`Command`, `Group`).
"""

from __future__ import annotations

import logging
import sys

import click

from swarm import __version__
from swarm.errors import SwarmError

EXIT_OK = 0
EXIT_USER_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# every command's epilog; docs/exit-codes.md has the same table
EXIT_CODES = (
    f"Exit status: {EXIT_OK} done, or a peer, bootstrap or health page stopped (SIGTERM, Ctrl-C); {EXIT_USER_ERROR} an "
    f"error of input or environment, in one line on stderr; {EXIT_USAGE} a usage error (an option refused); "
    f"{EXIT_INTERRUPTED} another command interrupted by Ctrl-C. docs/exit-codes.md has the table."
)
HELP_OPTION_NAMES = ["-h", "--help"]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL_VARIABLE = "BLOCKSWARM_LOG_LEVEL"
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click 8.2 on; before, groups exit 0 with help


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
    except NO_ARGS_IS_HELP as error:  # a group given no command (swarm-bench): its help, whole, as click shows it
        sys.stderr.write(error.format_message() + "\n")
        sys.exit(EXIT_USAGE)
    except click.ClickException as error:
        _fail(name, error.format_message(), error.exit_code)
    except SwarmError as error:
        _fail(name, str(error), EXIT_USER_ERROR)
    except (KeyboardInterrupt, click.Abort):
        _fail(name, "interrupted", EXIT_INTERRUPTED)
    sys.exit(status if isinstance(status, int) else 0)


def _set_log_level(context: click.Context, parameter: click.Parameter, value: str) -> str:
    """--log-level takes effect as it is parsed (eager), before the command's own work logs anything;
    hivemind's loggers keep a level and a handler of their own, so they are set too."""
    level = getattr(logging, value.upper())
    for name in (None, "hivemind"):
        logging.getLogger(name).setLevel(level)
    return value


def _show_version(context: click.Context, parameter: click.Parameter, value: bool) -> None:
    if value and not context.resilient_parsing:
        click.echo(f"{context.command_path} (blockswarm) {__version__}")
        context.exit(EXIT_OK)


def convention_options() -> list[click.Option]:
    """--log-level and --version, which every command takes (click's conventions: see Command)."""
    return [
        click.Option(["--log-level"], type=click.Choice(LOG_LEVELS, case_sensitive=False), default="INFO",
                     metavar=f"[{'|'.join(LOG_LEVELS)}]",
                     show_default=True, envvar=LOG_LEVEL_VARIABLE, show_envvar=True, expose_value=False,
                     is_eager=True, callback=_set_log_level, help="The least severe log lines shown on stderr."),
        click.Option(["--version"], is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
                     help="Show the version and exit."),
    ]  # fmt: skip


class Command(click.Command):
    """A BlockSwarm command: `-h` as well as `--help`, `--log-level`, `--version`, and the exit codes
    in its epilog. Every command is made with `cls=Command` (or a `Group`'s), so that these come
    with it and no command can forget one (tests/test_conventions.py checks them all)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("context_settings", {}).setdefault("help_option_names", HELP_OPTION_NAMES)
        kwargs.setdefault("epilog", EXIT_CODES)
        super().__init__(*args, **kwargs)
        self.params += convention_options()


class Group(click.Group):
    """A group of BlockSwarm commands: the group and every command in it follow the conventions (Command)."""

    command_class = Command

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("context_settings", {}).setdefault("help_option_names", HELP_OPTION_NAMES)
        kwargs.setdefault("epilog", EXIT_CODES)
        super().__init__(*args, **kwargs)
        self.params += convention_options()


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
