"""A bootstrap node: a long-running DHT entry point, and the creator of a new swarm (swarm-bootstrap).

It joins (or starts) the DHT, answers joining peers' dial-back checks (its libp2p daemon also
relays for peers behind NAT), hands the line others join with (`--swarm S --creator F
--initial-peers ...`) to its caller, and every refresh period re-publishes the model record
(if it created the swarm) and logs the swarm's size, until stopped.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from typing import Callable

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.network import NetworkOptions, load_or_create_key, start_dht, stop_child, visible_maddrs
from swarm.p2p.reachability import serve_reachability

logger = logging.getLogger(__name__)


@dataclass
class BootstrapConfig:
    """What `swarm-bootstrap` is told."""

    swarm: str
    network: NetworkOptions
    creator: str | None = None  # fingerprint of the creator of the swarm it joins (None: it creates it, or trusts none)
    new_swarm: ModelConfig | None = None  # the model of the swarm it creates, signed with `creator_key`
    creator_key: str = "creator.key"  # the RSA key file that signs the model record (created on first use)
    refresh_period: float = 30.0  # seconds between re-publishing the model record and logging the swarm's size


def run_bootstrap(config: BootstrapConfig, on_ready: Callable[[str], None]) -> None:
    """Run the node until SIGINT or SIGTERM; `on_ready` gets the join line once it is reachable."""
    key = load_or_create_key(config.creator_key) if config.new_swarm else None
    dht = start_dht(config.swarm, config.network, key)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after the DHT's process was forked: it keeps the defaults
        signal.signal(sig, lambda *_: stopping.set())
    loop = p2p = None
    try:
        loop, p2p = serve_reachability(dht)  # joining peers ask it to dial them back; its daemon relays for those behind NAT
        directory = SwarmDirectory(dht, config.swarm, key, config.creator, config.network.dht_timeout)
        join = join_line(config.swarm, directory.fingerprint if config.new_swarm else config.creator, visible_maddrs(dht))
        on_ready(join)
        logger.info("swarm %r: join with  swarm-peer %s", config.swarm, join)
        while not stopping.is_set():
            refresh(directory, config.new_swarm, config.refresh_period)
            stopping.wait(config.refresh_period)
    finally:
        if loop is not None:
            loop.close(p2p)
        stop_child(dht, dht.shutdown)
        logger.info("bootstrap stopped")


def join_line(swarm: str, creator: str | None, addresses: list[str]) -> str:
    """The options every command joins this swarm with: its name, its creator, where to enter
    (`--initial-peers` once per address: the option takes one value each time)."""
    pinned = f" --creator {creator}" if creator else ""
    return f"--swarm {swarm}{pinned} " + " ".join(f"--initial-peers {address}" for address in addresses)


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
