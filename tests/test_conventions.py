"""Every command follows click's conventions: -h, --version, --log-level, help for every option, the
exit codes in its help, `python -m`, the join line from the environment, and a peer that leaves at
once when told to stop while it joins."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers import assert_one_line_error, run_command

from swarm import __version__
from swarm.cli.console import EXIT_CODES, EXIT_USAGE, Command, Group
from swarm.cli.programs import PROGRAMS, listing
from swarm.errors import SwarmError
from swarm.lab.launch import command_path
from swarm.model.generate import STEPS_PER_BLOCK
from swarm.p2p.bootstrap import JOIN_VARIABLES
from swarm.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
STOP_WITHIN_S = 5.0  # issue 45: a peer told to stop while it joins is gone within this


def command_of(module: str) -> click.Command:
    """The click command a program's module runs (the one its `main` hands to run_command)."""
    found = [v for v in vars(importlib.import_module(module)).values() if isinstance(v, click.Command)]
    tops = [c for c in found if not any(c in getattr(g, "commands", {}).values() for g in found)]
    assert len(tops) == 1, (module, tops)
    return tops[0]


def every_command() -> list[tuple[str, click.Command]]:
    """Every program's command and the commands of its groups, with their command lines."""
    found = []

    def walk(path: str, command: click.Command) -> None:
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(f"{path} {name}", sub)

    for program in PROGRAMS:
        walk(program.name, command_of(program.module))
    return found


def test_the_table_of_programs_is_what_pyproject_installs():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {p.name: f"{p.module}:main" for p in PROGRAMS} == scripts


@pytest.mark.parametrize("path, command", every_command(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_takes_h_version_log_level_and_says_its_exit_codes(path, command):
    assert isinstance(command, (Command, Group)), f"{path} is not made with cls=Command (swarm/cli/console.py)"
    runner = CliRunner()
    helped = runner.invoke(command, ["-h"], prog_name=path)
    assert helped.exit_code == 0 and helped.output.startswith(f"Usage: {path}"), helped.output
    assert "--log-level" in helped.output and "Exit status: 0" in helped.output
    assert " ".join(EXIT_CODES.split()[:6]) in " ".join(helped.output.split())
    shown = runner.invoke(command, ["--version"], prog_name=path)
    assert shown.exit_code == 0 and shown.output == f"{path} (blockswarm) {__version__}\n"


def test_log_level_sets_what_is_logged_ours_and_hiveminds():
    import logging

    command = command_of("swarm.cli.status")
    before = {name: logging.getLogger(name).level for name in (None, "hivemind")}
    try:
        for given, level in (("warning", logging.WARNING), ("DEBUG", logging.DEBUG)):
            done = CliRunner().invoke(command, ["--log-level", given, "--version"], prog_name="swarm-status")
            assert done.exit_code == 0, done.output
            assert logging.getLogger().level == logging.getLogger("hivemind").level == level
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("path, command", every_command(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_has_help(path, command):
    missing = [p.opts[0] for p in command.params if isinstance(p, click.Option) and not p.help]
    assert missing == [], f"{path}: options without help= {missing}"


def test_one_default_of_steps_per_block():
    defaults = {path: p.default for path, command in every_command() for p in command.params
                if p.name == "steps_per_block"}  # fmt: skip
    assert {"swarm-eval", "swarm-generate", "swarm-bench latency"} <= set(defaults)
    assert set(defaults.values()) == {STEPS_PER_BLOCK}


def test_the_bootstrap_shows_the_node_options_and_keeps_its_commands():
    group = command_of("swarm_bootstrap.main")
    runner = CliRunner()
    helped = runner.invoke(group, ["--help"], prog_name="swarm-bootstrap").output
    for shown in ("--new-swarm", "--config", "--host-maddrs", "--members-only", "invite", "keygen", "revoke"):
        assert shown in helped, shown
    assert "  run " not in helped  # the old name still runs the node, unlisted
    assert runner.invoke(group, ["run", "-h"], prog_name="swarm-bootstrap").exit_code == 0
    misplaced = runner.invoke(group, ["--new-swarm", "keygen", "k"], prog_name="swarm-bootstrap")
    assert misplaced.exit_code == EXIT_USAGE and "--new-swarm is an option of the node" in misplaced.output


def test_python_m_swarm_lists_every_command_and_each_runs_with_python_m():
    listed = subprocess.run([sys.executable, "-m", "swarm"], check=True, capture_output=True, text=True, cwd=ROOT)
    assert listed.stdout.strip() == listing()
    for program in PROGRAMS:
        assert f"python -m {program.module}" in listed.stdout
    assert all(variable in listed.stdout for variable in JOIN_VARIABLES.values())
    helped = subprocess.run([sys.executable, "-m", "swarm.cli.generate", "-h"], check=False, capture_output=True,
                            text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: swarm-generate"), helped.stderr


def test_installed_commands_answer_version_and_h():
    shown = run_command("swarm-peer", "--version")
    assert shown.returncode == 0 and shown.stdout == f"swarm-peer (blockswarm) {__version__}\n", shown.stderr
    helped = run_command("swarm-bootstrap", "-h")
    assert helped.returncode == 0 and "--new-swarm" in helped.stdout, helped.stderr
    bare = run_command("swarm-bench")  # a group with no command: its help as click prints it, not one squashed line
    assert bare.returncode == EXIT_USAGE and bare.stderr.startswith("Usage: swarm-bench [OPTIONS] COMMAND"), bare.stderr
    assert "\nCommands:\n  latency" in bare.stderr


def test_an_empty_data_file_is_one_line_of_ours(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    assert_one_line_error(run_command("swarm-train", "--data", "empty.txt", cwd=tmp_path), "--data empty.txt is empty")


def test_a_folder_without_text_is_refused_and_a_missing_name_passes(tmp_path):
    from swarm.cli.options import checked_text_source

    option = click.Option(["--data"])
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("")
    with pytest.raises(SwarmError, match="holds no text"):
        checked_text_source(None, option, str(tmp_path / "folder"))
    (tmp_path / "folder" / "b.txt").write_text("some text")
    assert checked_text_source(None, option, str(tmp_path / "folder")) == str(tmp_path / "folder")
    assert checked_text_source(None, option, "some/dataset") == "some/dataset"  # load_corpus judges names


def test_without_matplotlib_swarm_bench_says_which_extra_to_install(monkeypatch):
    from swarm.cli.bench import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets where it is not installed
    with pytest.raises(SwarmError, match=r"pip install 'blockswarm\[bench\]'"):
        pyplot()


def test_an_option_given_wins_over_the_environment(monkeypatch):
    command = command_of("swarm.cli.status")
    monkeypatch.setenv(JOIN_VARIABLES["swarm"], "fromenv")
    monkeypatch.setenv(JOIN_VARIABLES["initial_peers"], "/ip4/127.0.0.1/tcp/1/p2p/A  /ip4/127.0.0.1/tcp/2/p2p/B")
    from_environment = command.make_context("swarm-status", []).params
    assert from_environment["swarm"] == "fromenv"
    assert from_environment["initial_peers"] == ("/ip4/127.0.0.1/tcp/1/p2p/A", "/ip4/127.0.0.1/tcp/2/p2p/B")
    given = command.make_context("swarm-status", ["--swarm", "given", "--initial-peers", "/ip4/127.0.0.1/tcp/3/p2p/C"])
    assert given.params["swarm"] == "given" and given.params["initial_peers"] == ("/ip4/127.0.0.1/tcp/3/p2p/C",)


def join_environment(bootstrap_log: str) -> dict[str, str]:
    """The variables of the `export` line the bootstrap logged."""
    line = next(line for line in bootstrap_log.splitlines() if "export BLOCKSWARM_" in line)
    words = shlex.split(line[line.index("export ") :])[1:]
    return dict(word.split("=", 1) for word in words)


def test_the_join_line_comes_from_the_environment(module_bootstrap, tmp_path):
    """swarm-status with no join option at all: the bootstrap's export line in its environment."""
    local, _ = module_bootstrap
    bootstrap = next(handle for handle in local.started if handle.name == "bootstrap")
    variables = join_environment(bootstrap.log())
    assert variables == {JOIN_VARIABLES["swarm"]: local.swarm, JOIN_VARIABLES["creator"]: local.creator,
                         JOIN_VARIABLES["initial_peers"]: " ".join(local.initial_peers)}  # fmt: skip
    status = subprocess.run([command_path("swarm-status"), "--json"], check=False, capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env={**os.environ, **variables})  # fmt: skip
    assert status.returncode == 0, status.stderr[-3000:]
    assert json.loads(status.stdout)["swarm"] == local.swarm


def test_a_call_on_the_event_loop_ends_soon_after_a_stop():
    """What a joining peer's download of its start checkpoint waits in (EventLoopThread.run): a stop
    cancels it at once; without one, the result or the timeout as before."""
    import asyncio
    import threading

    from swarm.p2p.network import EventLoopThread
    from swarm.waiting import WaitStopped

    loop, stop = EventLoopThread(name="test-loop"), threading.Event()
    try:
        assert loop.run(asyncio.sleep(0, result=7), 5, stop=stop) == 7
        with pytest.raises(TimeoutError):
            loop.run(asyncio.sleep(5), 0.2, stop=stop)
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        with pytest.raises(WaitStopped):
            loop.run(asyncio.sleep(30), 60, stop=stop)
        assert time.monotonic() - started < 2
        loop.run(asyncio.sleep(0.1), 5)  # the cancelled call ends before the loop closes, as in a peer
    finally:
        loop.close()


def test_a_peer_told_to_stop_while_it_waits_to_join_leaves_within_seconds(lent_swarm):
    """A peer of a swarm with no model record waits for one (up to its join timeout, 30 s); SIGTERM
    then ends it cleanly, at once."""
    local, _ = lent_swarm
    peer = local.start_peer("joining", "0", ["--swarm", "nomodel"])
    waiting = lambda: "model record of swarm 'nomodel'" in peer.log() or peer.process.poll() is not None
    wait_for(waiting, 60, "the peer to wait for the model record")
    assert peer.process.poll() is None, peer.log()[-3000:]
    sent = time.monotonic()
    code = local.stop(peer, timeout=STOP_WITHIN_S + 5)
    took = time.monotonic() - sent
    assert code == 0 and took < STOP_WITHIN_S, (code, took, peer.log()[-3000:])
    assert "stopped while joining" in peer.log() and "no model config found" not in peer.log()
