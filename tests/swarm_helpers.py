"""Helpers for tests that run a real swarm: processes on 127.0.0.1, waiting on conditions."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from swarm.directory import SwarmDirectory
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
