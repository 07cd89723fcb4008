"""Helpers for tests that run a real swarm: processes on 127.0.0.1, waiting on conditions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import conftest

from swarm.lab.attacks import plant_checkpoint, poisoned_block
from swarm.lab.hosting import CheckpointHost
from swarm.lab.launch import LocalSwarm, Started
from swarm.model.denoiser import ModelConfig
from swarm.p2p.client import SwarmClient
from swarm.p2p.network import NetworkOptions
from swarm.p2p.records import CheckpointInfo
from swarm.waiting import wait_for

__all__ = ["FAST_PEER", "HOSTS_SWARM", "client_of", "logs_end", "one_tests_peers", "poisoned_host", "tiny_swarm",
           "wait_for", "write_tiny_setup"]  # fmt: skip

HOSTS_SWARM = "transfer"  # the swarm of the checkpoint hosts that the `start` fixture (conftest.py) starts


def write_tiny_setup(folder: Path) -> tuple[str, str]:
    """A tiny model config and a small local corpus for swarm tests: (config path, corpus path)."""
    config, corpus = folder / "tiny.json", folder / "corpus.txt"
    config.write_text(json.dumps(conftest.TINY))
    text = conftest.SAMPLE_TEXT
    corpus.write_text("\n\n".join(text[i : i + 300] for i in range(0, 6000, 300)))
    return str(config), str(corpus)


# peers of the swarm tests: 6 steps, a checkpoint every 3, an announcement every second
FAST_PEER = ["--max-steps", "6", "--save-every", "3", "--announce-period", "1"]


@contextmanager
def tiny_swarm(
    workdir: Path, swarm: str, blocks: dict[str, str]
) -> Iterator[tuple[LocalSwarm, dict[str, Started], SwarmClient]]:
    """A bootstrap node and the named peers (name -> block) of a tiny model, each of their blocks served.

    Yields the swarm, the peer processes by name, and a client of the swarm in the test process.
    """
    config_path, corpus_path = write_tiny_setup(workdir)
    with LocalSwarm(workdir, swarm=swarm, config_path=config_path, data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2)
        peers = {name: local.start_peer(name, block, FAST_PEER) for name, block in blocks.items()}
        with local.client() as client:
            hosted = {int(block) for block in blocks.values()}
            directory = client.directory
            served = lambda: all(any(h.announcement.state == "serving" for h in directory.hosts(b)) for b in hosted)
            wait_for(served, 90, f"blocks {sorted(hosted)} served")
            yield local, peers, client


@contextmanager
def one_tests_peers(local: LocalSwarm, client: SwarmClient, folder: Path) -> Iterator[tuple[LocalSwarm, SwarmClient]]:
    """A bootstrap and client that a module's tests share (`tiny_swarm` without peers, module-scoped:
    one per test costs seconds each), lent to one test: the peers it starts keep their folders and
    logs in `folder`; after it each is ended, and its record gone, so the next test finds no host."""
    local.workdir, before = folder, len(local.started)
    try:
        yield local, client
    finally:
        ours = local.started[before:]
        del local.started[before:]
        for handle in ours:
            local.end(handle)
        listed = lambda: any(client.directory.all_hosts(conftest.TINY["n_blocks"]).values())
        wait_for(lambda: not listed(), 30, "the test's peers gone from the records")


def poisoned_host(local: LocalSwarm, config: ModelConfig, step: int) -> tuple[CheckpointHost, CheckpointInfo]:
    """A node in this process that serves a plausible, poisoned checkpoint of block 0 (trained on
    shuffled text) stamped `step`, and that checkpoint's info: a stranger's, for it to announce."""
    folder = local.workdir / "stranger-plant"
    folder.mkdir(exist_ok=True)
    planted = plant_checkpoint(folder, poisoned_block(config, 0, local.data, folder, steps=10), config, 0, step,
                               local.swarm)  # fmt: skip
    host = CheckpointHost(local.workdir / "stranger", local.swarm, 0, initial_peers=local.initial_peers, config=config)
    return host, host.put(planted.read_bytes(), step)


def client_of(*nodes: CheckpointHost) -> SwarmClient:
    """A client of the swarm the checkpoint hosts `nodes` are in, as `swarm-fetch` would join it."""
    return SwarmClient(HOSTS_SWARM, NetworkOptions(initial_peers=[m for node in nodes for m in node.maddrs]))


def logs_end(started: dict[str, Started], lines: int = 15) -> str:
    """The last `lines` lines of each started process's log, for a failure message: a wait that
    times out in CI leaves nothing else behind to say which peer stalled, and where."""
    return "\n".join(f"--- {name}:\n" + "\n".join(handle.log().splitlines()[-lines:])
                     for name, handle in started.items())

