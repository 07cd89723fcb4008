"""swarm-peer: join a swarm, host one block, train it, serve it.

Option parsing only: every default is `PeerConfig`'s (or its sync settings'), every mode is
swarm/sync/modes.py's, and the life of the peer is `swarm.peer.life.Peer`. Two options exist for
benchmarks that start peers as processes, which nothing but a command line reaches; they become
`PeerHooks`, not settings.
"""

from __future__ import annotations

import click

from swarm.cli.console import Command, run_command
from swarm.cli.options import checked_text_source, member_options, network_options, swarm_options
from swarm.p2p.reachability import REACHABILITY_CHOICES
from swarm.peer.config import PeerConfig
from swarm.peer.life import Peer, PeerHooks
from swarm.serving.ar_pipeline import untrained_stage
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.exchange import MAX_STEPS_IN_FLIGHT, json_lines
from swarm.sync.modes import MODES, modes_help, payload_modes
from swarm.sync.pseudo_gradient import COMPRESSIONS, OuterConfig

PEER, DE_MO, OUTER = PeerConfig(), DeMoConfig(), OuterConfig()
PAYLOAD_MODES = ", ".join(payload_modes())


@click.command("swarm-peer", cls=Command)
@swarm_options
@member_options
@click.option("--record-key", default=PEER.record_key,
              help="RSA key file the peer signs its records with (made on first use). Where the swarm prices an "
              "identity, the solved work is kept beside it: with --identity, it is solved once, not every run.")
@click.option("--block", default=PEER.block, show_default=True, help="'auto' (the least hosted block) or an index.")
@click.option("--checkpoint-dir", default=PEER.checkpoint_dir, show_default=True,
              help="Folder of the block's checkpoints: it starts from its newest, and saves and serves them there.")
@click.option("--data", default=PEER.data, callback=checked_text_source,
              help="Text file, folder or dataset name (default: built-in corpus).")
@click.option("--device", default=PEER.device, show_default=True,
              help="Torch device to train and serve the block on: cpu, cuda, cuda:1, mps.")
@click.option("--max-steps", type=click.IntRange(min=1), default=PEER.max_steps,
              help="Stop training at this step, then keep serving until stopped: the step it started from plus "
              "the steps it trained (a jump to the other replicas' step never ends a run).")
@click.option("--schedule-steps", type=click.IntRange(min=1), default=PEER.schedule_steps,
              help="Steps the learning rate's warm-up and cosine decay span (default: --max-steps); past them it "
              "stays at its floor.")
@click.option("--save-every", type=click.IntRange(min=1), default=PEER.save_every, show_default=True,
              help="Steps between two checkpoints (each is announced, and served to replicas and swarm-fetch).")
@click.option("--announce-period", type=click.FloatRange(min=0.5), default=PEER.announce_period, show_default=True,
              help="Seconds between two of its records in the DHT (a record lives a few periods).")
@click.option("--public-name", default=PEER.public_name, help="A name others see in swarm-status.")
@click.option("--batch-size", type=click.IntRange(min=1), default=PEER.batch_size, show_default=True,
              help="Windows of text per training step.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=PEER.lr, show_default=True,
              help="Peak learning rate of the block's own optimizer.")
@click.option("--low-memory", is_flag=True, default=PEER.low_memory,
              help="Use less memory for more time: each layer's activations are recomputed in the backward pass "
              "instead of kept (the same gradients), and freed tensors' memory goes back to the system at once "
              "(figures: benchmarks/README.md, 'Cost as a block grows').")
@click.option("--sync", type=click.Choice(list(MODES)), default=PEER.sync, show_default=True, help=modes_help())
@click.option("--sync-deadline", type=click.FloatRange(min=0.1), default=PEER.sync_deadline, show_default=True,
              help="Seconds a step waits for the other replicas.")
@click.option("--overlap-steps", type=click.IntRange(min=1, max=MAX_STEPS_IN_FLIGHT), default=PEER.overlap_steps,
              show_default=True, help="demo-overlap: apply each step's gathered set this many steps late (more time "
              "for the exchange, a staler update).")
@click.option("--spare-batch-size", type=click.IntRange(min=0), default=PEER.spare_batch_size, show_default=True,
              help=f"{PAYLOAD_MODES}: while the other replicas' payloads are not all in, compute spare batches of "
              "this many windows instead of waiting; the next step averages them in (0: wait idle). "
              "At most --batch-size.")
@click.option("--wait-for-replicas", type=click.IntRange(min=1), default=PEER.wait_for_replicas, show_default=True,
              help="Start training once this many replicas of the block (itself included) are up; "
              "averaging groups hold up to this many.")
@click.option("--average-every", type=click.IntRange(min=0), default=PEER.average_every, show_default=True,
              help="Every this many steps, replicas that may have drifted apart merge their checkpoints of that step "
                   "into a coordinate-wise median weighted by the keys behind each (at least 3 keys, else nothing "
                   "changes); 0: never.")
@click.option("--top-k", type=click.IntRange(min=1), default=DE_MO.top_k, show_default=True,
              help="DeMo: kept per 64x64 tile.")
@click.option("--value-bits", type=click.Choice(["16", "1"]), default=str(DE_MO.value_bits), show_default=True,
              help="DeMo: bfloat16 values or 1-bit signs.")
@click.option("--momentum-decay", type=click.FloatRange(0, 1, max_open=True), default=DE_MO.momentum_decay,
              show_default=True, help="DeMo: how much of its local momentum a replica keeps each step.")
@click.option("--demo-lr", "step_lr", type=click.FloatRange(min=0, min_open=True), default=DE_MO.step_lr,
              show_default=True, help="DeMo: the step's peak rate (the RMS of each parameter's step; it follows "
              "the --lr schedule).")
@click.option("--outer-steps", type=click.IntRange(min=1), default=OUTER.steps, show_default=True,
              help="outer, outer-overlap: local steps between outer steps (H).")
@click.option("--outer-compression", type=click.Choice(COMPRESSIONS), default=OUTER.compression, show_default=True,
              help="outer: top-k of each tile's DCT, of the raw change, or none (every value, float32).")
@click.option("--outer-top-k", type=click.IntRange(min=1), default=OUTER.top_k, show_default=True,
              help="outer: kept per 64x64 tile.")
@click.option("--outer-value-bits", type=click.Choice(["2", "1"]), default=str(OUTER.value_bits), show_default=True,
              help="outer: sign and one of two sizes per tile, or sign and one size.")
@click.option("--outer-lr", type=click.FloatRange(min=0, min_open=True), default=OUTER.outer_lr, show_default=True,
              help="outer: the outer step's learning rate.")
@click.option("--reachability", type=click.Choice(REACHABILITY_CHOICES), default=PEER.reachability, show_default=True,
              help="auto: ask the initial peers to dial back, and behind NAT (nobody can) be reached through their "
              "relays, in DHT client mode; direct or relayed: skip the check.")
@click.option("--expect-config-hash", default=PEER.expect_config_hash,
              help="Refuse to join unless the swarm's model config hash starts with this (see swarm-status).")
@click.option("--serve-ar-stage", is_flag=True, hidden=True,
              help="For benchmarks: also serve a stage of an untrained autoregressive pipeline (benchmarks/serve.py).")
@click.option("--sync-trace", type=click.Path(dir_okay=False, writable=True), default=None,
              help=f"For benchmarks: append each payload publish and each wait for the others' payloads to this file "
              f"(JSON lines, monotonic times; {PAYLOAD_MODES}): benchmarks/sync.py tells network waits from waits "
              "for slower replicas.")
def peer_command(top_k, value_bits, momentum_decay, step_lr, outer_steps, outer_compression, outer_top_k,
                 outer_value_bits, outer_lr, serve_ar_stage, sync_trace, **kwargs):  # fmt: skip
    """Join a swarm and train one block of its model."""
    network = network_options(kwargs)
    de_mo = DeMoConfig(top_k=top_k, value_bits=int(value_bits), momentum_decay=momentum_decay, step_lr=step_lr)
    outer = OuterConfig(steps=outer_steps, compression=outer_compression, top_k=outer_top_k,
                        value_bits=int(outer_value_bits), outer_lr=outer_lr)  # fmt: skip
    hooks = PeerHooks(servicers=untrained_stage if serve_ar_stage else None,
                      sync_trace=json_lines(sync_trace) if sync_trace else None)  # fmt: skip
    Peer(PeerConfig(network=network, de_mo=de_mo, outer=outer, **kwargs), hooks).run()


def main() -> None:
    run_command(peer_command)


if __name__ == "__main__":
    main()
