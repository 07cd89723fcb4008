"""The config schema: what a config dataclass's field tells the command line, written beside the field.

A field that is a command-line option carries an `Option` in its metadata (`field(default=8,
metadata=option("DeMo: kept per 64x64 tile.", min=1))`): its help, its bounds or choices, and
its name where `--field-name` will not do. Its type and default are the field's own. Everything
else is made from that one place: swarm/cli/config_options.py turns a config class into click
options (each with an environment variable) and the parsed values back into the config, the
options page in docs/ is written from those options, and `check_options` holds a config built
in Python to the same bounds. A field that holds another config (PeerConfig's `de_mo`) brings
that config's options along. As torchtitan's JobConfig and tyro derive a command line from
dataclasses; ours is this small because it needs only what swarm-peer uses.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

from swarm.errors import SwarmError

METADATA_KEY = "option"
PEER_ENVVAR_PREFIX = "BLOCKSWARM_PEER"  # swarm-peer's options as environment variables: BLOCKSWARM_PEER_<NAME>


@dataclass(frozen=True)
class Option:
    """What a field declares about its command-line option (bounds inclusive unless `*_open`)."""

    help: str
    name: str | None = None  # the option's name, "--demo-lr"; None: "--" and the field's name with dashes
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False
    # the values taken, of the field's type (16 and 1 for --value-bits), or what gives them when asked
    # (a table that may grow: --sync's modes; `check_options` asks each time, a command line once, at import)
    choices: tuple | Callable[[], tuple] | None = None

    def allowed(self) -> tuple | None:
        """The values taken now (None: any within the bounds)."""
        return self.choices() if callable(self.choices) else self.choices


def option(help: str, **facts: Any) -> dict[str, Option]:
    """A field's metadata that makes it a command-line option; `facts` are `Option`'s other fields."""
    return {METADATA_KEY: Option(help, **facts)}


@dataclass(frozen=True)
class ConfigOption:
    """One option of a config class: the field it sets (`path` from the outer config down), its type
    (int, float, str or bool, None allowed where `optional`), its default, and what the field declares."""

    path: tuple[str, ...]
    kind: type
    optional: bool
    default: Any
    declared: Option

    @property
    def name(self) -> str:
        return self.declared.name or "--" + self.path[-1].replace("_", "-")

    def bounds(self) -> str:
        """The values taken, in words, for an error message ("" where any value of the type is taken)."""
        declared = self.declared
        if (allowed := declared.allowed()) is not None:
            return "one of " + ", ".join(str(c) for c in allowed)
        low = None if declared.min is None else f"{'above' if declared.min_open else 'at least'} {declared.min}"
        high = None if declared.max is None else f"{'below' if declared.max_open else 'at most'} {declared.max}"
        return " and ".join(part for part in (low, high) if part)

    def takes(self, value: Any) -> bool:
        """Whether `value` is within this option's bounds or choices (None is, where the field allows it)."""
        declared = self.declared
        if value is None:
            return self.optional
        if (allowed := declared.allowed()) is not None:
            return value in allowed
        above = declared.min is None or (value > declared.min if declared.min_open else value >= declared.min)
        below = declared.max is None or (value < declared.max if declared.max_open else value <= declared.max)
        return above and below


def options_of(config_class: type, path: tuple[str, ...] = ()) -> list[ConfigOption]:
    """Every option of a config class, in its fields' order, those of the configs it holds where they sit."""
    found = []
    hints = get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        kind, optional = _plain_type(hints[field.name])
        if METADATA_KEY in field.metadata:
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            found.append(ConfigOption((*path, field.name), kind, optional, default, field.metadata[METADATA_KEY]))
        elif dataclasses.is_dataclass(kind):
            found += options_of(kind, (*path, field.name))
    return found


def _plain_type(hint: Any) -> tuple[type, bool]:
    """`int | None` as (int, True), `int` as (int, False)."""
    if get_origin(hint) in (Union, types.UnionType):
        kinds = [arg for arg in get_args(hint) if arg is not type(None)]
        return kinds[0], len(kinds) < len(get_args(hint))
    return hint, False


def _value_at(config: Any, path: tuple[str, ...]) -> Any:
    """The value of the field at `path` in `config` (("de_mo", "top_k"): config.de_mo.top_k)."""
    for name in path:
        config = getattr(config, name)
    return config


def check_options(config: Any) -> None:
    """SwarmError naming the first option of `config` (and of the configs it holds) out of its bounds:
    a config made in Python meets the bounds the command line puts on the same option."""
    for entry in options_of(type(config)):
        value = _value_at(config, entry.path)
        if not entry.takes(value):
            raise SwarmError(f"{entry.name} must be {entry.bounds() or 'given'}, not {value!r}")
