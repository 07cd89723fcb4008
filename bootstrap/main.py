"""swarm-bootstrap: a long-running DHT entry point, and the creator of a new swarm."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from swarm.cli.console import run_command
from swarm.cli.options import network_options, swarm_options
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.network import load_or_create_key, start_dht, stop_child, visible_maddrs
from swarm.p2p.reachability import serve_reachability

logger = logging.getLogger("bootstrap")


@click.command("swarm-bootstrap")
@swarm_options
@click.option("--new-swarm", is_flag=True, help="Create the swarm: publish its model config as <swarm>.model, signed.")
@click.option("--config", "config_path", default=None, help="Model config JSON for --new-swarm (default: built-in).")
@click.option("--creator-key", default="creator.key", show_default=True,
              help="With --new-swarm: the RSA key that signs the model record (created on first use); keep it to "
              "stay the swarm's creator across restarts.")
@click.option("--refresh-period", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds between re-publishing the model config and logging the swarm's size.")
def bootstrap_command(new_swarm, config_path, creator_key, refresh_period, **kwargs):
    """Run a stable DHT entry point; print the options others join with on one line."""
    swarm, creator = kwargs.pop("swarm"), kwargs.pop("creator")
    network = network_options(kwargs)
    if network.identity_path is None:
        network.identity_path = "bootstrap.id"
    config = ModelConfig.from_json_file(config_path) if new_swarm else None
    key = load_or_create_key(creator_key) if new_swarm else None
    dht = start_dht(swarm, network, key)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after the DHT's process was forked: it keeps the defaults
        signal.signal(sig, lambda *_: stopping.set())
    loop = p2p = None
    try:
        loop, p2p = serve_reachability(dht)  # joining peers ask it to dial them back; its daemon relays for those behind NAT
        directory = SwarmDirectory(dht, swarm, key, creator, network.dht_timeout)
        join = join_line(swarm, directory.fingerprint if new_swarm else creator, visible_maddrs(dht))
        sys.stdout.write(join + "\n")
        sys.stdout.flush()
        logger.info("swarm %r: join with  swarm-peer %s", swarm, join)
        while not stopping.is_set():
            refresh(directory, config, refresh_period)
            stopping.wait(refresh_period)
    finally:
        if loop is not None:
            loop.close(p2p)
        stop_child(dht, dht.shutdown)
        logger.info("bootstrap stopped")


def join_line(swarm: str, creator: str | None, addresses: list[str]) -> str:
    """The options every command joins this swarm with: its name, its creator, where to enter."""
    pinned = f" --creator {creator}" if creator else ""
    return f"--swarm {swarm}{pinned} --initial-peers {' '.join(addresses)}"


def refresh(directory: SwarmDirectory, config: ModelConfig | None, refresh_period: float) -> None:
    """Re-publish the model record (if this node created the swarm) and log the swarm's size;
    a slow DHT costs one round, never the bootstrap."""
    try:
        if config is not None:
            directory.publish_model(config, lifetime_s=4 * refresh_period)
        log_swarm_size(directory, config)
    except SwarmError as error:
        logger.warning("refresh skipped: %s", error)


def log_swarm_size(directory: SwarmDirectory, config: ModelConfig | None) -> None:
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
