"""swarm-peer's options are made from the config schema (swarm/schema.py): each default, bound and help line
is written once, beside its field, and the command line, the environment variables, `PeerConfig.checked()`
and docs/peer-options.md all follow it. No swarm is joined: the peer is replaced by one that keeps its config."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import peers.main
from peers import options_page
from swarm.errors import SwarmError
from swarm.peer.config import PeerConfig
from swarm.schema import ConfigOption, Option, options_of
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.pseudo_gradient import OuterConfig

NOT_OPTIONS = {"join_timeout"}  # PeerConfig's fields no option sets (its tests and the library's callers do)


def shown_options() -> dict[str, click.Option]:
    return {name: p for p in peers.main.peer_command.params if isinstance(p, click.Option) for name in p.opts}


def test_every_option_of_the_schema_is_an_option_of_swarm_peer_with_the_fields_default():
    entries = options_of(PeerConfig)
    assert {"--batch-size", "--demo-lr", "--top-k", "--outer-top-k", "--value-bits"} <= {e.name for e in entries}
    assert [e.path for e in entries if e.name == "--demo-lr"] == [("de_mo", "step_lr")]
    shown = shown_options()
    for entry in entries:
        option = shown[entry.name]
        default = str(entry.default) if entry.declared.choices else entry.default  # choices are words: "16"
        assert option.default == default, entry.name
        assert option.envvar == "BLOCKSWARM_PEER_" + entry.name[2:].replace("-", "_").upper() and option.show_envvar
        assert option.help == entry.declared.help


def test_swarm_peer_given_nothing_runs_on_the_configs_defaults(parsed):
    """Every field of PeerConfig (the shared join-line and network options' too) has an option whose default is
    the field's: a default written in one place only. A field no option sets is named in NOT_OPTIONS."""
    assert parsed() == PeerConfig()
    params = {p.name for p in peers.main.peer_command.params}
    unset = [f for f in PeerConfig.__dataclass_fields__ if f not in params | {"de_mo", "outer", "network"}]
    assert unset == sorted(NOT_OPTIONS)


def test_options_land_on_their_fields_with_their_types(parsed):
    config = parsed("--top-k", "4", "--value-bits", "1", "--demo-lr", "0.003", "--outer-top-k", "128",
                    "--outer-value-bits", "1", "--outer-compression", "raw", "--sync", "outer",
                    "--max-steps", "9")  # fmt: skip
    assert config.de_mo == DeMoConfig(top_k=4, value_bits=1, step_lr=0.003)
    assert config.outer == OuterConfig(top_k=128, value_bits=1, compression="raw")
    assert (config.sync, config.max_steps, config.schedule_steps) == ("outer", 9, None)


def test_an_environment_variable_sets_an_option_and_the_command_line_wins(parsed, monkeypatch):
    monkeypatch.setenv("BLOCKSWARM_PEER_BATCH_SIZE", "7")
    monkeypatch.setenv("BLOCKSWARM_PEER_VALUE_BITS", "1")
    monkeypatch.setenv("BLOCKSWARM_PEER_OUTER_TOP_K", "128")
    monkeypatch.setenv("BLOCKSWARM_PEER_LOW_MEMORY", "1")
    config = parsed()
    assert (config.batch_size, config.de_mo.value_bits, config.outer.top_k, config.low_memory) == (7, 1, 128, True)
    config = parsed("--batch-size", "9", "--value-bits", "16")
    assert (config.batch_size, config.de_mo.value_bits, config.outer.top_k) == (9, 16, 128)
    assert "BLOCKSWARM_PEER_BATCH_SIZE" in CliRunner().invoke(peers.main.peer_command, ["-h"]).output


@pytest.mark.parametrize("option, variable, value", [
    ("--batch-size", "BLOCKSWARM_PEER_BATCH_SIZE", "0"),
    ("--sync", "BLOCKSWARM_PEER_SYNC", "fast"),
])  # fmt: skip
def test_an_environment_variable_out_of_bounds_is_refused_naming_it(parsed, monkeypatch, option, variable, value):
    """A usage error (exit 2, one line through run_command) that names the option and the variable."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(click.BadParameter) as refused:
        parsed()
    assert f"Invalid value for '{option}' (env var: '{variable}')" in refused.value.format_message()


@pytest.mark.parametrize("config, message", [
    (PeerConfig(announce_period=0.2), "--announce-period must be at least 0.5, not 0.2"),
    (PeerConfig(sync="fast"), "--sync must be one of demo, demo-overlap, outer, outer-overlap, dense, none"),
    (PeerConfig(overlap_steps=0), "--overlap-steps must be at least 1 and at most 4, not 0"),
    (PeerConfig(de_mo=DeMoConfig(momentum_decay=1.0)), "--momentum-decay must be at least 0 and below 1, not 1.0"),
    (PeerConfig(outer=OuterConfig(value_bits=3)), "--outer-value-bits must be one of 2, 1, not 3"),
])  # fmt: skip
def test_a_config_made_in_python_is_held_to_the_bounds_of_the_command_line(config, message):
    with pytest.raises(SwarmError, match=message):
        config.checked()
    assert PeerConfig(max_steps=None, lr=1e-9).checked() and OuterConfig().checked()


def test_an_option_takes_none_only_where_its_field_may_be_none():
    bounded = ConfigOption(("steps",), int, False, 1, Option("h", min=1))
    assert bounded.takes(1) and not bounded.takes(0) and not bounded.takes(None)
    assert ConfigOption(("steps",), int, True, None, Option("h", min=1)).takes(None)
    half_open = ConfigOption(("lr",), float, False, 1.0, Option("h", min=0, min_open=True))
    assert not half_open.takes(0.0) and half_open.takes(1e-9) and half_open.bounds() == "above 0"


def test_the_options_page_is_what_options_page_writes(tmp_path, monkeypatch, capsys):
    assert options_page.render() == options_page.PAGE.read_text(), "stale: run python -m peers.options_page"
    page = tmp_path / "peer-options.md"
    page.write_text(options_page.PAGE.read_text().replace("BLOCKSWARM_PEER_BATCH_SIZE", "BLOCKSWARM_PEER_BATCH"))
    monkeypatch.setattr(options_page, "PAGE", page)
    assert options_page.main(["--check"]) == 1  # a planted stale page fails the check, in one line
    assert capsys.readouterr().err.splitlines() == ["peer-options.md is stale: run python -m peers.options_page"]
    assert options_page.main([]) == 0 and options_page.main(["--check"]) == 0  # rewritten, it matches again
    assert page.read_text() == options_page.render()
