"""A bootstrap node: a long-running DHT entry point, and the creator of a new swarm (swarm-bootstrap).

It joins (or starts) the DHT, answers joining peers' dial-back checks (its libp2p daemon also
relays for peers behind NAT), hands the line others join with (`--swarm S --creator F
--initial-peers ...`) to its caller, and every refresh period re-publishes the model record
(if it created the swarm) and logs the swarm's size, until stopped.

The creator of a members-only swarm (`members_only`) says so in the model record, and every
refresh period also re-publishes the revocations file (`revocations`, which
`swarm-bootstrap revoke` writes) as the swarm's `S.revoked` record: a revocation reaches the
swarm within a refresh period, while the node runs.

The creator of an open swarm may price an identity (`identity_work`, swarm/p2p/work.py): the
model record it signs says how much work a peer's record must carry to count.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.model.units import TokenUnits
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.members import read_revocations
from swarm.p2p.network import NetworkOptions, load_or_create_key, start_dht, stop_child, visible_maddrs
from swarm.p2p.reachability import PROBE_TIMEOUT_S, serve_reachability
from swarm.p2p.records import IdentityWork
from swarm.p2p.tokenizer import TokenizerServicer

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
    members_only: bool = False  # with new_swarm: only keys with a member certificate count (swarm/p2p/members.py)
    revocations: str = "revoked.json"  # with new_swarm: the creator's file of revoked certificates
    identity_work: IdentityWork | None = None  # with new_swarm: the work a peer's record must carry (work.py)


def run_bootstrap(config: BootstrapConfig, on_ready: Callable[[str], None]) -> None:
    """Run the node until SIGINT or SIGTERM; `on_ready` gets the join line once it is reachable."""
    if config.members_only and config.new_swarm is None:
        raise SwarmError("--members-only goes with --new-swarm: the creator's model record says it")
    if config.identity_work is not None and config.identity_work.bits and config.new_swarm is None:
        raise SwarmError("--identity-work goes with --new-swarm: the creator's model record says it")
    if config.members_only:
        read_revocations(config.revocations)  # a file that does not read is one line now, not a warning later
    if config.new_swarm is not None:
        config.new_swarm.units()  # the creator must hold the tokenizer its model names: one line now if not
    key = load_or_create_key(config.creator_key) if config.new_swarm else None
    dht = start_dht(config.swarm, config.network, key)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after the DHT's process was forked: it keeps the defaults
        signal.signal(sig, lambda *_: stopping.set())
    loop = p2p = None
    try:
        # joining peers ask it to dial them back; its daemon relays for those behind NAT
        loop, p2p = serve_reachability(dht)
        units = config.new_swarm.units() if config.new_swarm else None
        if isinstance(units, TokenUnits):  # the creator hands its tokenizer to the first peers
            loop.run(TokenizerServicer(units).add_p2p_handlers(p2p), PROBE_TIMEOUT_S)
        directory = SwarmDirectory(dht, config.swarm, key, config.creator, config.network.dht_timeout)
        if config.new_swarm:
            directory.membership.set_terms(directory.owner_subkey, config.members_only)
            directory.work.terms = config.identity_work
        joining = config.swarm, directory.fingerprint if config.new_swarm else config.creator, visible_maddrs(dht)
        on_ready(join_line(*joining))
        logger.info("swarm %r: join with  swarm-peer %s", config.swarm, join_line(*joining))
        logger.info("or, for every command run after it:  %s", join_exports(*joining))
        while not stopping.is_set():
            refresh(directory, config, config.refresh_period)
            stopping.wait(config.refresh_period)
    finally:
        if loop is not None:
            loop.close(p2p)
        stop_child(dht, dht.shutdown)
        logger.info("bootstrap stopped")


# the environment variables that stand for the join line's options in every command (`export` them once
# instead of pasting the line into each); BLOCKSWARM_INITIAL_PEERS holds the addresses separated by spaces
JOIN_VARIABLES = {
    "swarm": "BLOCKSWARM_SWARM",
    "creator": "BLOCKSWARM_CREATOR",
    "initial_peers": "BLOCKSWARM_INITIAL_PEERS",
}


def join_line(swarm: str, creator: str | None, addresses: list[str]) -> str:
    """The options every command joins this swarm with: its name, its creator, where to enter
    (`--initial-peers` once per address: the option takes one value each time)."""
    pinned = f" --creator {creator}" if creator else ""
    return f"--swarm {swarm}{pinned} " + " ".join(f"--initial-peers {address}" for address in addresses)


def join_exports(swarm: str, creator: str | None, addresses: list[str]) -> str:
    """The join line as shell `export`s of JOIN_VARIABLES: the same swarm for every command run after it."""
    values = {"swarm": swarm, "creator": creator, "initial_peers": " ".join(addresses)}
    return "export " + " ".join(f"{JOIN_VARIABLES[k]}='{v}'" for k, v in values.items() if v)


def refresh(directory: SwarmDirectory, config: BootstrapConfig, refresh_period: float) -> None:
    """Re-publish the model record and the revocations (if this node created the swarm) and log the
    swarm's size; a slow DHT, or a revocations file that does not read, costs one round, never the
    bootstrap."""
    model, lifetime = config.new_swarm, 4 * refresh_period
    try:
        if model is not None:
            directory.publish_model(model, lifetime_s=lifetime, members_only=config.members_only,
                                    identity_work=config.identity_work)  # fmt: skip
        if model is not None and config.members_only:
            revocations = read_revocations(config.revocations)
            directory.membership.set_revoked(revocations)
            directory.publish_revocations(revocations, lifetime_s=lifetime)
        log_swarm_size(directory, model)
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
