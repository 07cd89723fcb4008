"""swarm-peer: join a swarm, host one block, train it, serve it."""

from __future__ import annotations

import click

from swarm.cli.console import run_command
from swarm.cli.options import network_options, swarm_options
from swarm.peer import Peer, PeerConfig
from swarm.sync.decoupled_momentum import DeMoConfig


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
@click.option("--sync", type=click.Choice(["demo", "dense", "none"]), default="demo", show_default=True,
              help="demo: DeMo exchange with the block's other replicas; dense: all-reduce of full fp32 "
              "gradients (the baseline); none: AdamW alone.")
@click.option("--sync-deadline", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds a step waits for the other replicas.")
@click.option("--wait-for-replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Start training once this many replicas of the block (itself included) are up; "
              "averaging groups hold up to this many.")
@click.option("--average-every", type=click.IntRange(min=0), default=100, show_default=True,
              help="Average parameters with the other replicas every this many steps, to bound drift (0: never).")
@click.option("--top-k", type=click.IntRange(min=1), default=8, show_default=True, help="DeMo: kept per 64x64 tile.")
@click.option("--value-bits", type=click.Choice(["16", "1"]), default="16", show_default=True,
              help="DeMo: bfloat16 values or 1-bit signs.")
@click.option("--momentum-decay", type=click.FloatRange(0, 1, max_open=True), default=0.999, show_default=True)
@click.option("--sign-lr", type=click.FloatRange(min=0, min_open=True), default=2e-3, show_default=True,
              help="DeMo: the sign step's learning rate.")
@click.option("--expect-config-hash", default=None,
              help="Refuse to join unless the swarm's model config hash starts with this (see swarm-status).")
def peer_command(top_k, value_bits, momentum_decay, sign_lr, **kwargs):
    """Join a swarm and train one block of its model."""
    network = network_options(kwargs)
    de_mo = DeMoConfig(top_k=top_k, value_bits=int(value_bits), momentum_decay=momentum_decay, sign_lr=sign_lr)
    Peer(PeerConfig(network=network, de_mo=de_mo, **kwargs)).run()


def main() -> None:
    run_command(peer_command)
