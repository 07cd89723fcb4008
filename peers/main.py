"""swarm-peer: join a swarm, host one block, train it, serve it.

Option parsing only: every option of `PeerConfig` (and of its sync settings) is made from the
config's fields (swarm/cli/config_options.py), each with an environment variable
(BLOCKSWARM_PEER_...), and the parsed values are built back into a `PeerConfig`; the join line's
options are those every swarm command shares. docs/peer-options.md lists them all
(`python -m peers.options_page` writes it). The life of the peer is `swarm.peer.life.Peer`. Two
options exist for benchmarks that start peers as processes, which nothing but a command line
reaches; they become `PeerHooks`, not settings.
"""

from __future__ import annotations

import click

from swarm.cli.config_options import config_from, config_options
from swarm.cli.console import Command, run_command
from swarm.cli.options import checked_text_source, member_options, network_options, swarm_options
from swarm.peer.config import PAYLOAD_MODES, PeerConfig
from swarm.peer.life import Peer, PeerHooks
from swarm.schema import PEER_ENVVAR_PREFIX
from swarm.serving.ar_pipeline import untrained_stage
from swarm.sync.exchange import json_lines

ENVVAR_PREFIX = PEER_ENVVAR_PREFIX


@click.command("swarm-peer", cls=Command)
@swarm_options
@member_options
@config_options(PeerConfig, ENVVAR_PREFIX, callbacks={"--data": checked_text_source})
@click.option("--serve-ar-stage", is_flag=True, hidden=True,
              help="For benchmarks: also serve a stage of an untrained autoregressive pipeline (benchmarks/serve.py).")
@click.option("--sync-trace", type=click.Path(dir_okay=False, writable=True), default=None,
              help=f"For benchmarks: append each payload publish and each wait for the others' payloads to this file "
              f"(JSON lines, monotonic times; {PAYLOAD_MODES}): benchmarks/sync.py tells network waits from waits "
              "for slower replicas.")  # fmt: skip
def peer_command(serve_ar_stage: bool, sync_trace: str | None, **kwargs) -> None:
    """Join a swarm and train one block of its model."""
    hooks = PeerHooks(servicers=untrained_stage if serve_ar_stage else None,
                      sync_trace=json_lines(sync_trace) if sync_trace else None)  # fmt: skip
    Peer(peer_config(kwargs), hooks).run()


def peer_config(values: dict) -> PeerConfig:
    """The `PeerConfig` that swarm-peer's parsed options describe (all but the benchmarks' two)."""
    return config_from(PeerConfig, values, network=network_options(values))


def main() -> None:
    run_command(peer_command)


if __name__ == "__main__":
    main()
