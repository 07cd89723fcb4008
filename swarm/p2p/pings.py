"""Round trips between peers over P2P: what a peer announces (`pings`) and what the health page measures.

A ping is one `rpc_info` call (swarm/checkpoints/transfer.py): its reply also says which key the
peer signs its records with, so the same call tells the health page whether a record's
writer is alive and is who the record says.

A peer measures a few round trips in the background (`NeighbourPings`), to the peers of its
own block and of the blocks next to it: the ones its sync payloads and a generation request
travel between. Like Petals' `next_pings`, they let anyone draw the swarm's round-trip
matrix from the records alone. A round never blocks the announcer and never raises: a peer
that does not answer is left out of the next announcement. Each answer given under the key of
a record that names the peer is also told to the peer's `Witness`: its uptime in the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future

from hivemind.p2p import P2P

from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.info import ask_info
from swarm.p2p.ledger import Witness
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import MAX_PING_S, MAX_PINGS, Ping

logger = logging.getLogger(__name__)

PING_TIMEOUT_S = 5.0


async def timed_info(p2p: P2P, peer_id: str, timeout: float) -> tuple[float, PeerInfo | None]:
    """(seconds, the peer's info), or (inf, None) if it does not answer in time or in form."""
    started = time.perf_counter()
    try:
        info = await ask_info(p2p, peer_id, timeout)
    except Exception:  # vanished, too slow, or a reply that is not a PeerInfo
        return float("inf"), None
    return time.perf_counter() - started, info


async def ask_all(p2p: P2P, peer_ids: list[str], timeout: float) -> dict[str, tuple[float, PeerInfo | None]]:
    """`timed_info` of every peer at once (each bounded by `timeout`), by peer id."""
    unique = list(dict.fromkeys(peer_ids))
    answers = await asyncio.gather(*(timed_info(p2p, peer_id, timeout) for peer_id in unique))
    return dict(zip(unique, answers))


def neighbour_blocks(block: int, n_blocks: int) -> list[int]:
    """The next block, this block, the previous one (on a ring, without repeats)."""
    return list(dict.fromkeys([(block + 1) % n_blocks, block, (block - 1) % n_blocks]))


class NeighbourPings:
    """Round trips from one peer to up to MAX_PINGS peers of its block and the neighbouring
    blocks, measured on the peer's event loop; `latest` is what its next announcement carries."""

    def __init__(self, directory: SwarmDirectory, p2p: P2P, loop: EventLoopThread, peer_id: str, block: int,
                 n_blocks: int, timeout: float = PING_TIMEOUT_S, witness: Witness | None = None):  # fmt: skip
        self.directory, self.p2p, self.loop, self.witness = directory, p2p, loop, witness
        self.peer_id, self.blocks, self.timeout = peer_id, neighbour_blocks(block, n_blocks), min(timeout, MAX_PING_S)
        self.latest: tuple[Ping, ...] = ()
        self._round: Future | None = None

    def start_round(self) -> None:
        """Start measuring unless a round is still running; returns at once."""
        if self._round is None or self._round.done():
            self._round = self.loop.submit(self._measure())

    async def _measure(self) -> None:
        try:
            targets, owners = await asyncio.to_thread(self._targets)
            answers = await ask_all(self.p2p, targets, self.timeout)
            answered = [(peer_id, rtt) for peer_id, (rtt, info) in answers.items() if info is not None]
            self.latest = tuple(Ping(peer_id=peer_id, seconds=min(rtt, MAX_PING_S)) for peer_id, rtt in answered)
            for peer_id, (_, info) in answers.items():
                if self.witness is not None and info is not None and (peer_id, info.owner) in owners:
                    self.witness.answered(peer_id, info.owner)
        except Exception as error:  # a slow DHT or a closing loop: keep the last round's figures
            logger.debug("measuring round trips failed: %s", error)

    def _targets(self) -> tuple[list[str], set[tuple[str, bytes]]]:
        """Peers of the neighbouring blocks, next block first, without this peer (a DHT read each),
        and the (peer id, key) of each record that names one."""
        hosts = [h for block in self.blocks for h in self.directory.hosts(block) if h.peer_id != self.peer_id]
        return list(dict.fromkeys(h.peer_id for h in hosts))[:MAX_PINGS], {(h.peer_id, h.owner) for h in hosts}
