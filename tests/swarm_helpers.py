"""Helpers for tests that run a real swarm: processes on 127.0.0.1, waiting on conditions."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from swarm.directory import SwarmDirectory
from swarm.launch import LocalSwarm, Started
from swarm.network import NetworkOptions, start_dht

import conftest

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll until `condition()` is truthy and return it; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@contextmanager
def directory_client(swarm: str, initial_peers: list[str]) -> Iterator[SwarmDirectory]:
    """A real DHT node in client mode, in the test process, reading the swarm's records."""
    dht = start_dht(swarm, NetworkOptions(initial_peers=list(initial_peers), client_mode=True))
    try:
        yield SwarmDirectory(dht, swarm)
    finally:
        dht.shutdown()


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
def tiny_swarm(workdir: Path, swarm: str, blocks: dict[str, str]) -> Iterator[tuple[LocalSwarm, dict[str, Started], SwarmDirectory]]:
    """A bootstrap node and the named peers (name -> block) of a tiny model, each of their blocks served.

    Yields the swarm, the peer processes by name, and a DHT client reading the swarm's records.
    """
    config_path, corpus_path = write_tiny_setup(workdir)
    with LocalSwarm(workdir, swarm=swarm, config_path=config_path, data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2)
        peers = {name: local.start_peer(name, block, FAST_PEER) for name, block in blocks.items()}
        with directory_client(swarm, local.initial_peers) as directory:
            hosted = {int(block) for block in blocks.values()}
            served = lambda: all(any(h.announcement.state == "serving" for h in directory.hosts(b)) for b in hosted)  # noqa: E731
            wait_for(served, 90, f"blocks {sorted(hosted)} served")
            yield local, peers, directory
