"""What a peer makes while it joins: one record per phase, and the record of the whole join.

`Peer._join` (life.py) runs the phases in this order, each a function of the records before it:
- `Entered` (`enter_swarm`, entering.py): the DHT, who this peer is in it, and the model the swarm trains;
- `Claimed` (`take_block`, start.py): its block, announced as taken from then on;
- `Wired` (`open_p2p`, services.py): its P2P handle, the loop its services run on, and who they answer;
- `Replica` (`make_replica`, replica.py): the block's trainer, its checkpoints and its denoise service;
- `Synced` (`set_up_sync`, sync_setup.py): how it keeps in step with the block's other replicas.

`Joined` holds all five, none missing. `Joining` holds those made so far: what the peer's record,
its `rpc_info` and its leaving read before the join ends (or after a stop or a failure mid-join).
What changes while the peer runs (its state, its checkpoint: `Served`, served.py) stays on the peer.
"""

from __future__ import annotations

from dataclasses import dataclass

from hivemind import DHT
from hivemind.p2p import P2P

from swarm.checkpoints.choice import SpotCheck
from swarm.checkpoints.store import CheckpointStore
from swarm.model.denoiser import ModelConfig
from swarm.model.train import Trainer
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.ledger import Witness
from swarm.p2p.limits import CallerGate
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import MemberProof, Reached
from swarm.peer.announcer import Announcer
from swarm.serving.server import DenoiseServicer
from swarm.sync.dense import CountingAverager
from swarm.sync.reconcile import ReconcileRound
from swarm.sync.strategy import NoSync, SyncStrategy
from swarm.sync.transport import PayloadServicer


@dataclass(frozen=True)
class Entered:
    """The DHT joined, this peer's identity in it, and the swarm's model config."""

    dht: DHT
    peer_id: str
    directory: SwarmDirectory  # the swarm's records, read and written under this peer's key
    model_config: ModelConfig
    reached: Reached  # how others dial it: directly, or through relays
    membership: MemberProof | None  # the proof it carries: only a member of an invite-only swarm has one
    work_nonce: int | None  # the work that prices this identity: only where the swarm prices one


@dataclass(frozen=True)
class Claimed:
    """Its block, announced as taken: from then on the announcer thread keeps its record alive."""

    block: int
    witness: Witness  # what it checked of others: the ledger's attestations
    announcer: Announcer


@dataclass(frozen=True)
class Wired:
    """The P2P handle its services and calls go through, and the loop they run on."""

    loop: EventLoopThread
    p2p: P2P
    gate: CallerGate  # who its services answer: members only, in a members-only swarm


@dataclass(frozen=True)
class Replica:
    """This peer's replica of its block: the trainer (the live weights), its checkpoints on disk,
    the spot check it measures others' checkpoints with, and the service that denoises for clients."""

    store: CheckpointStore
    spot_check: SpotCheck
    trainer: Trainer
    denoise_service: DenoiseServicer


@dataclass(frozen=True)
class Synced:
    """Keeping the block's replicas in step (swarm/sync/): the strategy of --sync, and what only
    some settings make (None otherwise)."""

    sync: SyncStrategy
    averager: CountingAverager | None  # a child process, for --sync dense alone
    reconcile: ReconcileRound | None  # rounds that bring drifted replicas back together, unless --average-every 0
    payloads: PayloadServicer | None  # the service of its sync payloads, for the modes that exchange them

    @classmethod
    def not_yet(cls) -> Synced:
        """Before the sync is set up: no exchange yet, so nothing sent or received."""
        return cls(sync=NoSync(), averager=None, reconcile=None, payloads=None)


@dataclass(frozen=True)
class Joined:
    """Everything a peer made while it joined; the running peer reads its parts from here."""

    entered: Entered
    claimed: Claimed
    wired: Wired
    replica: Replica
    synced: Synced


@dataclass
class Joining:
    """The records made so far of a join (None until their phase ends)."""

    entered: Entered | None = None
    claimed: Claimed | None = None
    wired: Wired | None = None
    replica: Replica | None = None
    synced: Synced | None = None

    def joined(self) -> Joined:
        """The whole join, once every phase has made its record."""
        made = (self.entered, self.claimed, self.wired, self.replica, self.synced)
        assert all(record is not None for record in made), f"a join with a phase missing: {made}"
        return Joined(*made)
