"""The peer's record on the DHT, kept alive by the "announcer" thread (the peer builds the record:
`Peer.announcement` in life.py, handed in as a callable, so this module knows nothing of the peer).

The thread wakes every announce period: it first reads the block's other replicas from the DHT
(the list the sync exchange asks; the trainer's thread never waits on a DHT read; in a
members-only swarm, after the creator's revocations), then stores
the peer's record and its attestation of what it checked of others (swarm/p2p/ledger.py), then
starts a round of pings to its neighbours (swarm/p2p/pings.py) on the p2p loop, whose figures go
into the next record. The main thread stores the record itself at
each change of state. It reads figures only, never weights.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from swarm.p2p.directory import DHTUnavailable, SwarmDirectory
from swarm.p2p.ledger import Witness, publish
from swarm.p2p.pings import NeighbourPings
from swarm.p2p.records import BlockAnnouncement

logger = logging.getLogger(__name__)

DHT_STORE_TIMEOUT_S = 20.0
RECORD_LIFETIME_PERIODS = 3  # a record lives this many announce periods unless stored again


class Announcer:
    """One peer's record of block `block`, and the replica list of that block, as last read."""

    def __init__(self, directory: SwarmDirectory, block: int, peer_id: str, period: float,
                 record: Callable[[], BlockAnnouncement], stopping: threading.Event,
                 witness: Witness | None = None):  # fmt: skip
        """`record` builds the record as it stands; `stopping` ends the thread; `witness` counts what
        this peer checked of others, published as its attestation."""
        self.directory, self.block, self.peer_id, self.period = directory, block, peer_id, period
        self.record, self.stopping, self.witness = record, stopping, witness
        self.pings: NeighbourPings | None = None  # round trips to neighbours, once the block is served
        self._replica_ids: list[str] = []  # written by the announcer thread, read by the trainer's
        self._replicas_started = 0  # the others training or done training (serving), as last read
        self._announcing = threading.Lock()  # held while a record is built and stored
        self._thread = threading.Thread(target=self._run, name="announcer", daemon=True)

    def start(self) -> None:
        """From now on the record is kept alive: a join that loads, checks or fetches for longer than
        a record lives must not vanish from the other replicas' lists (they would train on without
        this one's payloads) nor leave its block looking free to the next joiner."""
        self._thread.start()

    def ping_neighbours(self, pings: NeighbourPings) -> None:
        """Start measuring round trips to the neighbours, one round per announce period."""
        self.pings = pings

    def join(self) -> None:
        """Wait for the thread to end (after `stopping`): its last record must not land after a later one."""
        if self._thread.is_alive():
            self._thread.join(DHT_STORE_TIMEOUT_S)

    def replica_ids(self) -> list[str]:
        """The other peers training this block (joining ones are not asked before they train), as
        last read (a DHT read takes a round trip or more: the trainer's thread never waits for one)."""
        return self._replica_ids

    def read_replicas(self) -> None:
        """Read the other replicas of the block from the DHT (once per announce period, by the announcer)."""
        try:
            hosts = self.directory.hosts(self.block)
        except DHTUnavailable as error:  # a slow DHT: keep the replicas we knew, ask again next period
            logger.warning("block %d: %s; keeping the %d replicas known", self.block, error, len(self._replica_ids))
            return
        others = [h for h in hosts if h.peer_id != self.peer_id]
        self._replica_ids = sorted(
            h.peer_id for h in others if h.announcement.state == "training"
        )  # a joining one has no payloads to give yet: asking it would hold every step up to the deadline
        self._replicas_started = sum(h.announcement.state in ("training", "serving") for h in others)

    def replicas_started(self) -> int:
        """How many other replicas have started training (or already finished it), as last read: a
        start barrier counts a replica that reached its last step between two reads, not only the
        ones still training, or the slower of two quick replicas waits out its whole join timeout."""
        return self._replicas_started

    def read_revocations(self) -> None:
        """In a members-only swarm, read the creator's revocations again (once per announce period):
        from then on the directory skips a revoked key's records and the services refuse its calls."""
        if not self.directory.membership.members_only:
            return
        try:
            self.directory.read_revocations()
        except DHTUnavailable as error:  # the list known stays; the next period asks again
            logger.warning("revocations not read: %s", error)

    def announce(self, wait: bool = False) -> None:
        """Store this peer's record. One at a time, so that a record built before a change of
        state (the announcer's) never expires later than the one built after it (the main
        thread's): the later expiration is the one the DHT keeps."""
        lifetime = RECORD_LIFETIME_PERIODS * self.period
        try:
            with self._announcing:
                ok = self.directory.announce(self.block, self.record(), lifetime, wait=wait)
        except DHTUnavailable as error:  # the next announcement tries again; the record lives on meanwhile
            logger.warning("block %d: %s", self.block, error)
            return
        if wait and not ok:
            logger.warning("block %d: announcement was not stored by any DHT node", self.block)

    def attest(self) -> None:
        """Store this peer's attestation of what it checked of others, if it checked anything (in the
        background: a lost one is replaced by the next period's, which says as much and more)."""
        if self.witness is not None:
            publish(self.directory, self.witness)

    def _run(self) -> None:
        while not self.stopping.wait(self.period):
            try:
                self.read_revocations()  # before the replicas: a revoked key leaves the list now
                self.read_replicas()  # first: a failed announcement must not keep the replica list stale
                self.announce()
                self.attest()
                if self.pings is not None:
                    self.pings.start_round()  # in the background: its figures go into the next announcement
            except Exception as error:  # a DHT hiccup: the next period tries again
                logger.warning("block %d: announcing failed: %s", self.block, error)
