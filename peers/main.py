"""swarm-peer: join a swarm, host one block, train it, serve it."""

from __future__ import annotations

import click

from swarm.console import run_command
from swarm.options import network_options, swarm_options
from swarm.peer import Peer, PeerConfig


@click.command("swarm-peer")
@swarm_options
@click.option("--block", default="auto", show_default=True, help="'auto' (the least hosted block) or an index.")
@click.option("--checkpoint-dir", default="peer-checkpoints", show_default=True)
@click.option("--data", default=None, help="Text file, folder or dataset name (default: built-in corpus).")
@click.option("--device", default="cpu", show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Stop training after this many steps, then keep serving until stopped.")
@click.option("--save-every", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--announce-period", type=click.FloatRange(min=0.5), default=10.0, show_default=True)
@click.option("--public-name", default="", help="A name others see in swarm-status.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=2e-3, show_default=True)
@click.option("--serve-ar-stage", is_flag=True, hidden=True, help="Also serve an autoregressive stage (benchmarks).")
def peer_command(**kwargs):
    """Join a swarm and train one block of its model."""
    network = network_options(kwargs)
    Peer(PeerConfig(network=network, **kwargs)).run()


def main() -> None:
    run_command(peer_command)
