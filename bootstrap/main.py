"""swarm-bootstrap: a long-running DHT entry point, and the creator of a new swarm."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from swarm.cli.console import run_command
from swarm.cli.options import network_options, swarm_options
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.network import start_dht, visible_maddrs

logger = logging.getLogger("bootstrap")


@click.command("swarm-bootstrap")
@swarm_options
@click.option("--new-swarm", is_flag=True, help="Create the swarm: publish its model config as <swarm>.model.")
@click.option("--config", "config_path", default=None, help="Model config JSON for --new-swarm (default: built-in).")
@click.option("--refresh-period", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds between re-publishing the model config and logging the swarm's size.")
def bootstrap_command(new_swarm, config_path, refresh_period, **kwargs):
    """Run a stable DHT entry point; print the --initial-peers value others join with."""
    swarm = kwargs.pop("swarm")
    network = network_options(kwargs)
    if network.identity_path is None:
        network.identity_path = "bootstrap.id"
    config = ModelConfig.from_json_file(config_path) if new_swarm else None
    dht = start_dht(swarm, network)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        directory = SwarmDirectory(dht, swarm)
        addresses = " ".join(visible_maddrs(dht))
        sys.stdout.write(f"--initial-peers {addresses}\n")
        sys.stdout.flush()
        logger.info("swarm %r: join with  swarm-peer --swarm %s --initial-peers %s", swarm, swarm, addresses)
        while not stopping.is_set():
            if config is not None:
                directory.publish_model(config, lifetime_s=4 * refresh_period)
            log_swarm_size(directory, config)
            stopping.wait(refresh_period)
    finally:
        dht.shutdown()
        logger.info("bootstrap stopped")


def log_swarm_size(directory: SwarmDirectory, config) -> None:
    config = config or directory.read_model()
    if config is None:
        logger.info("no model config published yet")
        return
    hosts = directory.all_hosts(config.n_blocks)
    peers = {h.peer_id for block_hosts in hosts.values() for h in block_hosts}
    per_block = ", ".join(f"block {b}: {len(h)}" for b, h in hosts.items())
    logger.info("%d peers host blocks (%s)", len(peers), per_block)


def main() -> None:
    run_command(bootstrap_command)
