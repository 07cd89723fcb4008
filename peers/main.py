"""swarm-peer: join a swarm, host one block, train it, serve it."""

from __future__ import annotations

import click

from swarm.cli.console import run_command
from swarm.cli.options import network_options, swarm_options
from swarm.peer import SYNC_MODES, Peer, PeerConfig
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.exchange import MAX_STEPS_IN_FLIGHT
from swarm.sync.pseudo_gradient import COMPRESSIONS, OuterConfig


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
@click.option("--sync", type=click.Choice(SYNC_MODES), default="demo", show_default=True,
              help="demo: DeMo exchange with the block's other replicas, every step in lockstep; demo-overlap: "
              "the same, each step's exchange overlapped with the next step's compute; outer: --outer-steps local "
              "AdamW steps, then one compressed exchange; outer-overlap: the same, the exchange overlapped with "
              "the next round's steps; dense: all-reduce of full fp32 gradients (the baseline); "
              "none: AdamW alone.")
@click.option("--sync-deadline", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds a step waits for the other replicas.")
@click.option("--overlap-steps", type=click.IntRange(min=1, max=MAX_STEPS_IN_FLIGHT), default=1, show_default=True,
              help="demo-overlap: apply each step's gathered set this many steps late (more time for the "
              "exchange, a staler update).")
@click.option("--spare-batch-size", type=click.IntRange(min=0), default=0, show_default=True,
              help="demo, demo-overlap, outer, outer-overlap: while the other replicas' payloads are not all in, "
              "compute spare batches of this many windows instead of waiting; the next step averages them in "
              "(0: wait idle). At most --batch-size.")
@click.option("--sync-trace", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Append each payload publish and each wait for the others' payloads to this file "
              "(JSON lines, monotonic times; demo, demo-overlap, outer and outer-overlap): benchmarks/sync.py tells "
              "network waits from waits for slower replicas.")
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
@click.option("--outer-steps", type=click.IntRange(min=1), default=OuterConfig.steps, show_default=True,
              help="outer, outer-overlap: local steps between outer steps (H).")
@click.option("--outer-compression", type=click.Choice(COMPRESSIONS), default=OuterConfig.compression, show_default=True,
              help="outer: top-k of each chunk's DCT, of the raw change, or none (every value, float32).")
@click.option("--outer-top-k", type=click.IntRange(min=1), default=OuterConfig.top_k, show_default=True,
              help="outer: kept per 64x64 chunk.")
@click.option("--outer-value-bits", type=click.Choice(["2", "1"]), default=str(OuterConfig.value_bits), show_default=True,
              help="outer: sign and one of two sizes per chunk, or sign and one size.")
@click.option("--outer-lr", type=click.FloatRange(min=0, min_open=True), default=OuterConfig.outer_lr, show_default=True,
              help="outer: the outer step's learning rate.")
@click.option("--reachability", type=click.Choice(["auto", "direct", "relayed"]), default="auto", show_default=True,
              help="auto: ask the initial peers to dial back, and behind NAT (nobody can) be reached through their "
              "relays, in DHT client mode; direct or relayed: skip the check.")
@click.option("--expect-config-hash", default=None,
              help="Refuse to join unless the swarm's model config hash starts with this (see swarm-status).")
def peer_command(top_k, value_bits, momentum_decay, sign_lr, outer_steps, outer_compression, outer_top_k,
                 outer_value_bits, outer_lr, **kwargs):
    """Join a swarm and train one block of its model."""
    network = network_options(kwargs)
    de_mo = DeMoConfig(top_k=top_k, value_bits=int(value_bits), momentum_decay=momentum_decay, sign_lr=sign_lr)
    outer = OuterConfig(steps=outer_steps, compression=outer_compression, top_k=outer_top_k,
                        value_bits=int(outer_value_bits), outer_lr=outer_lr)  # fmt: skip
    Peer(PeerConfig(network=network, de_mo=de_mo, outer=outer, **kwargs)).run()


def main() -> None:
    run_command(peer_command)
