"""Entering the swarm, the first phase of a peer's join (life.py): its identity, the DHT, the
model the swarm trains, and what this identity needs to count there.

Its own module because it is the one phase that deals in identities: the key its records are
signed with, a member's certificate, the work that prices an identity; the phases after it read
only what it made (`Entered`, parts.py).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable

from hivemind.utils.crypto import RSAPrivateKey

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p import reachability
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.members import Credentials, load_credentials
from swarm.p2p.network import load_or_create_key, start_dht, stop_child
from swarm.p2p.records import MemberProof, Reached
from swarm.p2p.work import stored_or_solved, work_path
from swarm.peer.config import PeerConfig
from swarm.peer.parts import Entered
from swarm.sync.modes import MODES

logger = logging.getLogger(__name__)


class StoppedWhileJoining(Exception):
    """A stop signal came while the peer was still joining: leave at once."""


def identity(config: PeerConfig) -> tuple[Credentials | None, RSAPrivateKey]:
    """Its credentials and the key its records are signed with: a member signs with its certified
    key; anyone else with `--record-key`'s (made on first use), else a new one."""
    if config.member_key is not None:
        credentials = load_credentials(config.member_key, config.certificate)
        return credentials, credentials.key
    return None, load_or_create_key(config.record_key) if config.record_key else RSAPrivateKey()


def enter_swarm(
    config: PeerConfig,
    key: RSAPrivateKey,
    credentials: Credentials | None,
    stopping: threading.Event,
    closers: list[Callable[[], None]],
) -> Entered:
    """Start the DHT (reachable directly or through relays; stopped by `closers`), read the model
    it trains, and show what this identity needs to count there (a member's certificate, the work
    that prices it)."""
    network = reachability.plan(config.network, config.reachability)  # before announcing anything
    dht = start_dht(config.swarm, network, key)
    closers.append(functools.partial(stop_child, dht, dht.shutdown))
    peer_id = dht.peer_id.to_base58()
    if network.relayed:
        logger.info("behind NAT: reachable through %s", ", ".join(reachability.require_circuit(dht)))
    directory = SwarmDirectory(dht, config.swarm, key, config.creator, config.network.dht_timeout)
    logger.info("joined the DHT as %s; reading the model record of swarm %r", peer_id, config.swarm)
    model_config = _model_config(config, directory, stopping)
    membership = credentials.proof(peer_id) if credentials is not None else None
    if directory.membership.members_only:
        _check_membership(config, directory, membership, peer_id)
    work_nonce = _identity_work(config, directory, peer_id, stopping) if directory.work.required else None
    reached: Reached = "relayed" if network.relayed else "direct"
    return Entered(dht, peer_id, directory, model_config, reached, membership, work_nonce)


def _model_config(config: PeerConfig, directory: SwarmDirectory, stopping: threading.Event) -> ModelConfig:
    """The swarm's model config, once its record is found; SwarmError if it is not the one expected."""
    model_config = directory.wait_for_model(config.join_timeout, stop=stopping)
    expected, found = config.expect_config_hash, model_config.hash()
    if expected and not found.startswith(expected.lower()):
        raise SwarmError(f"swarm {config.swarm!r} trains model config {found[:16]}, not the expected {expected[:16]}")
    return model_config


def _identity_work(config: PeerConfig, directory: SwarmDirectory, peer_id: str, stopping: threading.Event) -> int:
    """The nonce that prices this identity (key and peer id) in its swarm (swarm/p2p/work.py): kept
    beside its key, else solved now, minutes at a real swarm's price; a stop signal ends the search."""
    key_path = config.member_key or config.record_key
    if key_path is None or config.network.identity_path is None:
        logger.warning("swarm %r prices an identity: without --record-key and --identity this peer's work is "
                       "solved again every run", config.swarm)  # fmt: skip
    nonce = stored_or_solved(work_path(key_path) if key_path else None, directory.work.terms, config.swarm,
                             directory.fingerprint, peer_id, stopping)  # fmt: skip
    if nonce is None:
        raise StoppedWhileJoining()
    return nonce


def _check_membership(
    config: PeerConfig, directory: SwarmDirectory, membership: MemberProof | None, peer_id: str
) -> None:
    """SwarmError unless this peer would count in its members-only swarm: a certificate the
    others accept, and a sync mode whose partners can be checked (hivemind's averager groups
    with any key that asks, so `--sync dense` is not offered there)."""
    swarm = config.swarm
    if membership is None:
        raise SwarmError(f"swarm {swarm!r} is members-only: join with --member-key and --certificate (its "
                         "creator issues them: swarm-bootstrap keygen, then swarm-bootstrap invite)")  # fmt: skip
    refused = directory.membership.refusal(membership, peer_id)
    if refused:
        raise SwarmError(f"swarm {swarm!r} is members-only and refuses this peer's certificate: {refused}")
    if MODES[config.sync].averages_gradients:
        raise SwarmError(f"--sync {config.sync} trusts every groupmate (hivemind's averager) and cannot check "
                         f"that they are members: members-only swarm {swarm!r} does not offer it")  # fmt: skip
