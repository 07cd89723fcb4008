"""click options made from a config class's schema (swarm/schema.py), the config built back from them,
and the reference page of a command's options.

Each option takes its name, help, bounds and choices from the field's `Option`, its type and default
from the field, and an environment variable from its name (`--batch-size` of swarm-peer:
BLOCKSWARM_PEER_BATCH_SIZE; an option on the command line wins). So a default, a bound or a help
line is written once, beside the field, and `swarm-peer --help`, `PeerConfig.checked()` and
docs/peer-options.md cannot disagree.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints

import click

from swarm.schema import ConfigOption, options_of

Config = TypeVar("Config")
PAGE_WIDTH = 100  # the options page's prose; its table's rows are one line each, as markdown needs
CLICK_TYPES = {int: (click.INT, click.IntRange), float: (click.FLOAT, click.FloatRange), str: (click.STRING, None)}


def _envvar(prefix: str, name: str) -> str:
    """The environment variable of an option: BLOCKSWARM_PEER and --outer-top-k give BLOCKSWARM_PEER_OUTER_TOP_K."""
    return f"{prefix}_{name.removeprefix('--').replace('-', '_').upper()}"


def config_options(config_class: type, prefix: str, callbacks: dict[str, Callable] | None = None) -> Callable:
    """A decorator adding the click option of every option of `config_class` to a command, in its fields'
    order, where the decorator sits; `callbacks` (by option name) check a value where the schema cannot
    (a --data file with no text)."""
    callbacks = callbacks or {}
    made = [_click_option(entry, prefix, callbacks.get(entry.name)) for entry in options_of(config_class)]

    def decorate(command: Callable) -> Callable:
        for add in reversed(made):
            command = add(command)
        return command

    return decorate


def _click_option(entry: ConfigOption, prefix: str, callback: Callable | None) -> Callable:
    declared = entry.declared
    settings: dict[str, Any] = {"default": entry.default, "envvar": _envvar(prefix, entry.name), "show_envvar": True,
                                "help": declared.help, "callback": callback}  # fmt: skip
    if entry.kind is bool:
        settings["is_flag"] = True
    elif (allowed := declared.allowed()) is not None:  # shown and typed as words: "16" and "1" for an int field
        settings["type"] = click.Choice([str(choice) for choice in allowed])
        settings["default"] = None if entry.default is None else str(entry.default)
    else:
        plain, ranged = CLICK_TYPES[entry.kind]
        bounds = (declared.min, declared.max, declared.min_open, declared.max_open)
        settings["type"] = ranged(*bounds) if bounds[:2] != (None, None) else plain
    settings["show_default"] = not (entry.default is None or entry.default is False or entry.default == "")
    return click.option(entry.name, **settings)


def config_from(config_class: type[Config], values: dict[str, Any], **given: Any) -> Config:
    """The config that a command's parsed values describe. The values of `config_options` are taken out
    of `values` and set on their fields (the configs it holds made the same way); the rest of `values`
    and `given` set fields of `config_class` itself (options made elsewhere: --swarm, the network's)."""
    fields: dict[tuple[str, ...], Any] = {}
    for entry in options_of(config_class):
        value = values.pop(_parameter(entry))
        if (allowed := entry.declared.allowed()) is not None and value is not None:
            value = {str(choice): choice for choice in allowed}[value]
        fields[entry.path] = value
    return _built(config_class, fields, {**values, **given})


def _parameter(entry: ConfigOption) -> str:
    """The name click gives the option's value among a command's keyword arguments."""
    return entry.name.removeprefix("--").replace("-", "_")


def _built(config_class: type, fields: dict[tuple[str, ...], Any], rest: dict) -> Any:
    """`config_class` with `fields` (by path from it) and `rest` (its own fields) set; each config it holds
    that some of `fields` sit in is built the same way, the others keep their defaults."""
    own, held = {}, {}
    for path, value in fields.items():
        if len(path) == 1:
            own[path[0]] = value
        else:
            held.setdefault(path[0], {})[path[1:]] = value
    hints = get_type_hints(config_class)
    return config_class(**own, **{name: _built(hints[name], inner, {}) for name, inner in held.items()}, **rest)


def options_page(command: click.Command, title: str, intro: str) -> str:
    """A markdown page of every option `command --help` shows: its environment variable, default, the
    values it takes and its help, read from the command itself so that the page says what it does."""
    context = click.Context(command, info_name=command.name, **command.context_settings)  # -h as well as --help
    shown = [p for p in command.get_params(context) if isinstance(p, click.Option) and not p.hidden]
    rows = [f"| {_row(option, context)} |" for option in shown]
    header = ["| option | environment variable | default | takes | what it does |", "|---|---|---|---|---|"]
    prose = textwrap.fill(intro, PAGE_WIDTH, break_on_hyphens=False)
    return "\n".join([f"# {title}", "", prose, "", *header, *rows]) + "\n"


def _row(option: click.Option, context: click.Context) -> str:
    names = ", ".join(f"`{name}`" for name in [*option.opts, *option.secondary_opts])
    variables = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar or [])
    variable = ", ".join(f"`{v}`" for v in variables)
    cells = [names, variable, _default(option, context), _takes(option), option.help or ""]
    return " | ".join(cell.replace("|", "\\|") for cell in cells)


def _default(option: click.Option, context: click.Context) -> str:
    """The default as the command line would write it ("" where there is none, or a flag is off)."""
    default = option.get_default(context, call=False)
    if option.is_flag:
        return "on" if default else ""
    if option.multiple:  # click leaves a repeatable option given no default unset, not ()
        return " ".join(f"`{value}`" for value in default) if isinstance(default, list | tuple) else ""
    return "" if default in (None, "") or callable(default) else f"`{default}`"


def _takes(option: click.Option) -> str:
    """The values an option takes, as click's help shows them: its choices, a range (`x>=1`), or its type."""
    kind = option.type
    if option.is_flag:
        taken = "flag"
    elif isinstance(kind, click.Choice):
        taken = ", ".join(f"`{choice}`" for choice in kind.choices)
    elif isinstance(kind, click.IntRange | click.FloatRange):
        taken = f"{'integer' if isinstance(kind, click.IntRange) else 'number'}, `{_range(kind)}`"
    else:
        taken = kind.name
    return f"{taken}, repeatable" if option.multiple else taken


def _range(kind: click.IntRange | click.FloatRange) -> str:
    """A range as click's help writes it: `x>=1`, `x>0`, `0<=x<1`."""
    if kind.max is None:
        return f"x{'>' if kind.min_open else '>='}{kind.min}"
    low = "" if kind.min is None else f"{kind.min}{'<' if kind.min_open else '<='}"
    return f"{low}x{'<' if kind.max_open else '<='}{kind.max}"
