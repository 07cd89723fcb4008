"""Shared fixtures: a tiny model config and small byte streams, sized for a 2-core machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from hypothesis import HealthCheck, settings

from swarm.model.data import Windows
from swarm.model.denoiser import ModelConfig

if TYPE_CHECKING:
    from swarm.peer.config import PeerConfig

# property-based tests (test_fuzz*.py): few examples, the same ones every run (derandomized, no
# example database), no per-example deadline (a loaded 2-core machine is slow now and then)
settings.register_profile("blockswarm", max_examples=50, derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
settings.load_profile("blockswarm")

# Raw bytes, not the built-in tokenizer's 8192 units: a tiny model of bytes trains in the seconds a
# test has. tests/test_units.py runs the same paths (training, a swarm, generation) on tokens.
TINY = {"prefix_len": 16, "gen_len": 8, "d_model": 32, "n_heads": 2, "n_layers": 4, "n_blocks": 2,
        "vocab_size": 256, "tokenizer": None, "tie_embeddings": False}

SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. "
    "A swarm of small computers can train one model together, block by block. "
) * 40


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(**TINY)


@pytest.fixture
def tiny_windows(tiny_config) -> Windows:
    return Windows(torch.tensor(list(SAMPLE_TEXT.encode()), dtype=torch.uint8), tiny_config.seq_len)


@pytest.fixture
def tiny_config_file(tmp_path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture
def text_file(tmp_path) -> Path:
    """A small text file of paragraphs: a local corpus for the commands."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(SAMPLE_TEXT[i : i + 300] for i in range(0, len(SAMPLE_TEXT), 300)))
    return path


@pytest.fixture
def start(tmp_path, tiny_config):
    """`start(name, servicer=BlockServicer)`: a CheckpointHost of block 0 of `tiny_config` on
    127.0.0.1, in swarm_helpers.HOSTS_SWARM; all are closed after the test."""
    from swarm_helpers import HOSTS_SWARM

    from swarm.checkpoints.transfer import BlockServicer  # hivemind only for the tests that use it
    from swarm.lab.hosting import CheckpointHost

    started = []

    def start_host(name: str, servicer=BlockServicer) -> CheckpointHost:
        started.append(CheckpointHost(tmp_path / name, HOSTS_SWARM, servicer=servicer, config=tiny_config))
        return started[-1]

    yield start_host
    for host in started:
        host.close()


@pytest.fixture(scope="module")
def module_bootstrap(tmp_path_factory, request):
    """A bootstrap node of a tiny model and a client in this process, for the tests of one module
    to share (one per test costs seconds each): see `lent_swarm`."""
    from swarm_helpers import tiny_swarm

    name = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    with tiny_swarm(tmp_path_factory.mktemp(name), name, {}) as (local, _, client):
        yield local, client


@pytest.fixture
def lent_swarm(module_bootstrap, tmp_path):
    """The module's bootstrap and client, lent to one test (swarm_helpers.one_tests_peers)."""
    from swarm_helpers import one_tests_peers

    with one_tests_peers(*module_bootstrap, tmp_path) as lent:
        yield lent


@pytest.fixture
def parsed(monkeypatch):
    import peers.main  # the command, only for the tests that parse it

    """Parse swarm-peer's arguments into the PeerConfig it would run (the environment as monkeypatch left it)."""
    given = []

    class Kept:  # in place of the peer: keeps the config it is handed, joins nothing
        def __init__(self, config, hooks):
            given.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr(peers.main, "Peer", Kept)

    def parse(*args: str) -> PeerConfig:
        peers.main.peer_command.main(list(args), standalone_mode=False)
        return given[-1]

    return parse
