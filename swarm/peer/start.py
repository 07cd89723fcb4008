"""Where a peer starts: the block it takes, the weights it starts from, and when its first step runs.

Its own module because these are the join's choices made on what others announce: the block
with the fewest live hosts, the checkpoint chosen on evidence (swarm/checkpoints/choice.py) and
the lineage that comes with it, and the barrier that holds the first step until enough replicas
are up. Each reads the DHT through `read_dht`, which a slow DHT or a stop signal cannot hang.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from hivemind.utils.crypto import RSAPrivateKey

from swarm.checkpoints.choice import Choice, choose_checkpoint
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import DHTUnavailable, least_hosted_block
from swarm.p2p.ledger import Witness, backed_keys
from swarm.p2p.records import BlockAnnouncement
from swarm.peer.announcer import RECORD_LIFETIME_PERIODS, Announcer
from swarm.peer.config import PeerConfig
from swarm.peer.entering import StoppedWhileJoining
from swarm.peer.parts import Claimed, Entered, Replica, Wired
from swarm.peer.served import Served
from swarm.waiting import wait_for

logger = logging.getLogger(__name__)

JOIN_FETCH_TIMEOUT_S = 600.0  # choosing a start checkpoint: a few verified downloads and spot checks
T = TypeVar("T")


def read_dht(read: Callable[[], T], what: str, timeout: float, stopping: threading.Event) -> T:
    """A DHT read needed to join, retried while the DHT is slow, up to the join timeout."""

    def attempt() -> tuple[T] | None:
        if stopping.is_set():
            raise StoppedWhileJoining()
        try:
            return (read(),)
        except DHTUnavailable as error:
            logger.warning("%s; trying again", error)
            return None

    return wait_for(attempt, timeout, what, interval=1.0, stop=stopping)[0]


def take_block(
    config: PeerConfig,
    entered: Entered,
    key: RSAPrivateKey,
    record: Callable[[], BlockAnnouncement],
    stopping: threading.Event,
) -> Claimed:
    """Choose a block and announce it as taken (`record` builds the peer's record as it stands);
    from then on a thread keeps announcing it, until `stopping`."""
    block = _choose_block(config, entered, stopping)
    logger.info("peer %s hosts block %d of swarm %r", entered.peer_id, block, config.swarm)
    period = config.announce_period
    witness = Witness(key, config.swarm, entered.peer_id, RECORD_LIFETIME_PERIODS * period, entered.membership)
    announcer = Announcer(entered.directory, block, entered.peer_id, period, record, stopping, witness)
    announcer.announce(wait=True)  # as "joining": peers choosing a block now see this one taken
    announcer.start()
    return Claimed(block, witness, announcer)


def _choose_block(config: PeerConfig, entered: Entered, stopping: threading.Event) -> int:
    n_blocks = entered.model_config.n_blocks
    if config.block == "auto":
        hosts = read_dht(
            lambda: entered.directory.all_hosts(n_blocks), "the hosts of every block", config.join_timeout, stopping
        )
        return least_hosted_block(hosts)
    block = int(config.block)
    if block >= n_blocks:
        raise SwarmError(f"block index {block} is out of range: swarm {config.swarm!r} has blocks 0..{n_blocks - 1}")
    return block


def load_start_state(
    entered: Entered,
    claimed: Claimed,
    wired: Wired,
    replica: Replica,
    served: Served,
    join_timeout: float,
    stopping: threading.Event,
) -> None:
    """Start from the checkpoint chosen on evidence (swarm/checkpoints/choice.py): the one the
    replicas agree on that passes the spot check, unless its own newest is as fresh; else
    fresh weights."""
    block, directory, store = claimed.block, entered.directory, replica.store
    own = store.latest()
    own = (own[0].read_bytes(), own[1]) if own else None
    hosts = read_dht(lambda: directory.hosts(block), f"the hosts of block {block}", join_timeout, stopping)
    others = [h for h in hosts if h.peer_id != entered.peer_id and h.announcement.checkpoint is not None]
    if not others and own is None:
        logger.info("block %d: no checkpoint anywhere, starting fresh", block)
        return
    coro = choose_checkpoint(wired.p2p, others, entered.model_config, block, replica.spot_check, own,
                             keys_count=directory.keys_count, backed=backed_keys(directory))  # fmt: skip
    try:
        choice = wired.loop.run(coro, JOIN_FETCH_TIMEOUT_S, stop=stopping)
    except (SwarmError, TimeoutError) as error:
        logger.warning("block %d: %s; starting fresh", block, error)
        return
    for passed in choice.passed:  # its hosts served a checkpoint that passed the spot check here
        claimed.witness.verified(passed.host.peer_id, passed.host.owner, passed.candidate.checkpoint.step)
    start_from(choice, entered.model_config, replica, served)


def start_from(choice: Choice, model_config: ModelConfig, replica: Replica, served: Served) -> None:
    """Load the chosen checkpoint into the trainer, at the step it believes, and keep its lineage."""
    trainer, store = replica.trainer, replica.store
    denoiser, _ = decode_block(choice.data, model_config, store.block)
    trainer.module.load_state_dict(denoiser.state_dict())
    trainer.step_count = step = choice.step  # its stamp, unless no other key's makes it plausible
    served.checkpoint = choice.checkpoint
    if choice.host is not None:
        origin = f"replica {choice.host.peer_id} ({choice.host.announcement.public_name or 'unnamed'})"
        if step == choice.checkpoint.step:
            store.adopt(choice.data, choice.checkpoint)
        else:  # the weights, under the step it takes: it never vouches for a stamp it does not believe
            served.checkpoint = store.save(trainer.module, step)
        served.lineage = (served.checkpoint, choice.taken_from)
        store.keep_lineage(served.checkpoint, choice.taken_from)
    else:
        origin = f"own checkpoint {store.path_for(choice.checkpoint.step)}"
        if (voices := store.lineage_of(choice.checkpoint)) is not None:  # adopted before a restart: not its own
            served.lineage = (choice.checkpoint, voices)
    served.time = time.time()
    logger.info("block %d: starting at step %d from %s (spot-check loss %.3f)", store.block, step, origin, choice.loss)


def wait_for_replicas(announcer: Announcer, config: PeerConfig, stopping: threading.Event) -> None:
    """Hold the first step until `wait_for_replicas` replicas are up, so they start in step."""
    deadline = time.monotonic() + config.join_timeout
    announcer.read_replicas()
    while announcer.replicas_started() + 1 < config.wait_for_replicas:
        if time.monotonic() >= deadline:
            logger.warning("block %d: %d of %d replicas up after %.0fs; training without waiting longer",
                           announcer.block, announcer.replicas_started() + 1, config.wait_for_replicas,
                           config.join_timeout)  # fmt: skip
            return
        if stopping.wait(0.5):
            return
        announcer.read_replicas()
