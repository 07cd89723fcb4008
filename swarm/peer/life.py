"""A swarm peer: joins, picks a block, starts from the freshest replica, trains, serves, announces.

`Peer.run()` is the whole life of `swarm-peer`, each phase in a module of its own:
1. join the DHT and read the swarm's model config (`S.model`; entering.py);
2. pick a block (`auto`: the one with the fewest live hosts; start.py);
3. start from its own newest checkpoint, else the freshest verified replica's, else fresh
   (start.py, into the replica that replica.py makes);
4. serve its checkpoints over P2P (services.py), set up its sync (sync_setup.py) and announce
   itself under `S.block.<b>`;
5. train with the core's block trainer, saving every `save_every` steps, until `max_steps`
   or a stop signal (training.py); from the moment it chose its block (step 2), a thread
   announces it every `announce_period` seconds (announcer.py);
6. on stop: save, announce that it is leaving, shut down.

Steps 1 to 4 are the join: its phases each make one record of what they built (parts.py), and
the running peer reads them from `Joined`, where none is missing. A stop or a failure mid-join
leaves from wherever it got to: the records made so far say what to save and announce, and what
it started (the DHT, the loop, the averager) is stopped, last made first. `Peer` runs the phases
in order and holds what changes while it runs: its state, the checkpoint it serves (served.py).

Threads and processes, and who may touch the weights:
- the main thread joins, then trains: it alone reads and writes the block's live weights (the
  optimizer or sync step, a reconcile round, the start state), and at each save it hands the
  denoise service a copy of the checkpoint it is about to announce;
- the "announcer" thread stores the peer's record every announce period; it reads figures only,
  and starts a round of pings to its neighbours (swarm/p2p/pings.py) on the p2p loop;
- the "p2p-loop" thread runs an asyncio loop with the P2P services (info and checkpoint
  downloads, sync payloads, remote denoising) and the calls the main thread makes to other
  peers; a denoise request computes in the loop's worker threads on a copy of the announced
  checkpoint (never on the live weights), which `swap_in` replaces whole;
- child processes: hivemind's DHT (with its libp2p daemon) and, for `--sync dense` alone,
  hivemind's averager; the main thread hands gradients to the averager and takes its result
  itself.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from swarm import __version__
from swarm.p2p.messages import PeerInfo
from swarm.p2p.records import BlockAnnouncement, PeerState
from swarm.peer.config import PeerConfig
from swarm.peer.entering import StoppedWhileJoining, enter_swarm, identity
from swarm.peer.memory import return_freed_memory
from swarm.peer.parts import Joined, Joining, Synced
from swarm.peer.replica import make_replica
from swarm.peer.served import Served
from swarm.peer.services import ExtraServicers, open_p2p, serve_block
from swarm.peer.start import load_start_state, take_block, wait_for_replicas
from swarm.peer.sync_setup import SyncTrace, set_up_sync
from swarm.peer.training import TrainingLoop, settle_to_leave
from swarm.waiting import WaitStopped

logger = logging.getLogger(__name__)

LOSS_WINDOW = 20  # steps averaged into the announced loss
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class PeerHooks:
    """What a benchmark hands a peer besides its config (a production peer takes none).

    Args:
        servicers: more P2P services to run, made once the block is known (model config, block),
            e.g. a stage of the autoregressive pipeline for benchmarks/serve.py.
        sync_trace: gets each payload publish and each wait of the sync exchange (benchmarks/sync.py).
    """

    servicers: ExtraServicers | None = None
    sync_trace: SyncTrace | None = None


def _default_stop_signals() -> None:
    """In a child process just forked from a peer: stop signals do what they do by default."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


class Peer:
    """One peer's life; `stop()` (or SIGINT/SIGTERM) ends it cleanly after the current step.

    Its parts are made by the join and held in `parts` (swarm/peer/parts.py): a `Joining` of the
    records made so far, then the `Joined` record the running peer reads (`joined`). What changes
    while it runs (its state, the checkpoint it serves and its lineage: `served`) is its own.
    """

    def __init__(self, config: PeerConfig, hooks: PeerHooks | None = None):
        self.config = config.checked()
        self.hooks = hooks or PeerHooks()
        self.stopping = threading.Event()
        self.credentials, self.private_key = identity(self.config)
        self.state: PeerState = "joining"
        self.parts: Joining | Joined = Joining()
        # what the join started (child processes, the loop), stopped last made first when it leaves
        self._closers: list[Callable[[], None]] = []
        self.served = Served()

    @property
    def joined(self) -> Joined:
        """Its parts, once joined (the training loop's)."""
        assert isinstance(self.parts, Joined), "the peer has not joined yet"
        return self.parts

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        """SIGINT/SIGTERM stop it after the current step. Its child processes (the DHT, the averager)
        do not inherit that handler: a child told to stop by its own shutdown code stops."""
        os.register_at_fork(after_in_child=_default_stop_signals)
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.stop())
        if self.config.low_memory and return_freed_memory():  # before the block's first tensor
            logger.info("low memory: activations recomputed, freed memory returned to the system")
        try:
            self._join()
            self._train_until_stopped()
        except (StoppedWhileJoining, WaitStopped):
            logger.info("stopped while joining")
        finally:
            self._leave()

    def info(self) -> PeerInfo:
        """What this peer hosts: answered to `rpc_info` (status, ping; served from `open_p2p` on). `owner`
        is the key its records are signed with: a record naming this peer under another key is an impostor's."""
        entered, claimed = self.parts.entered, self.parts.claimed
        return PeerInfo(block=claimed.block, owner=entered.directory.owner_subkey, announcement=self.announcement(),
                        membership=entered.membership)  # fmt: skip

    def announcement(self) -> BlockAnnouncement:
        """This peer's record as it stands: who it is, its state and checkpoint, its training and sync
        figures (what the announcer thread stores every period; it reads figures only, never weights).
        While it joins, from the parts made so far (announced from `take_block` on)."""
        parts, served = self.parts, self.served
        entered, synced = parts.entered, parts.synced or Synced.not_yet()
        trainer, sync, reconcile = parts.replica.trainer if parts.replica else None, synced.sync, synced.reconcile
        recent = trainer.losses[-LOSS_WINDOW:] if trainer else []
        seconds = trainer.step_seconds[-LOSS_WINDOW:] if trainer else []
        joining = self.state == "joining"  # a joining record claims no progress
        pings = parts.claimed.announcer.pings if parts.claimed else None
        return BlockAnnouncement(
            peer_id=entered.peer_id,
            state=self.state,
            step=trainer.step_count if trainer and not joining else 0,
            checkpoint=None if joining else served.checkpoint,  # one it may not serve yet
            loss=sum(recent) / len(recent) if recent else None,
            throughput=len(seconds) / sum(seconds) if seconds else 0.0,
            version=__version__,
            public_name=self.config.public_name,
            checkpoint_time=served.time,
            sync_steps=sync.steps,
            sync_bytes_sent=sync.bytes_sent + (synced.averager.bytes_sent if synced.averager is not None else 0),
            sync_bytes_received=sync.bytes_received,
            sync_round_s=sync.round_seconds,
            compute_utilisation=trainer.utilisation(sync.wait_seconds) if trainer else None,
            drift=reconcile.drift if reconcile else None,
            pings=pings.latest if pings else (),
            reached=entered.reached,
            membership=entered.membership,
            work_nonce=entered.work_nonce,
            taken_from=served.taken_from(),
        )

    # joining

    def _join(self) -> Joined:
        """Join in phases, each made of the records of those before (swarm/peer/parts.py), each record
        kept in `parts` as it is made; a stop signal ends the join between two phases, and inside
        every wait of one (the model record, the DHT's reads, the replicas), within a few seconds."""
        config, stopping, closers = self.config, self.stopping, self._closers
        self.parts = parts = Joining()
        parts.entered = entered = enter_swarm(config, self.private_key, self.credentials, stopping, closers)
        self._stop_if_told()
        parts.claimed = claimed = take_block(config, entered, self.private_key, self.announcement, stopping)
        parts.wired = wired = open_p2p(entered, self.info, config.network.initial_peers, closers)
        parts.replica = replica = make_replica(config, entered, claimed.block, wired.gate)
        self._stop_if_told()
        load_start_state(entered, claimed, wired, replica, self.served, config.join_timeout, stopping)
        self._stop_if_told()
        start = self.served.checkpoint
        replica.denoise_service.swap_in(replica.trainer.module, start.sha256 if start else "")
        parts.synced = set_up_sync(config, entered, claimed, wired, replica, self.hooks.sync_trace, stopping, closers)
        self.parts = joined = parts.joined()
        serve_block(joined, self.hooks.servicers)
        self._stop_if_told()
        self.state = "training"
        claimed.announcer.announce(wait=True)
        wait_for_replicas(claimed.announcer, config, stopping)
        return joined

    def _stop_if_told(self) -> None:
        if self.stopping.is_set():
            raise StoppedWhileJoining()

    # training

    def _train_until_stopped(self) -> None:
        # the announcer has its own thread: a step that waits on other replicas must not let the record lapse
        joined = self.joined
        trained = TrainingLoop(self.config, joined, self.stopping, self.served).run()
        if self.stopping.is_set():
            return
        self.state = "serving"  # done training (max steps): still serves its block until stopped
        joined.claimed.announcer.announce(wait=True)
        logger.info("block %d: trained %d steps, to step %d; serving until stopped", joined.claimed.block, trained,
                    joined.replica.trainer.step_count)  # fmt: skip
        self.stopping.wait()

    # leaving

    def _leave(self) -> None:
        """Leave from wherever the join got to: with a block taken, a last record says "leaving" (after
        a save, once it has a trainer); then what the join started stops, last made first."""
        self.stopping.set()  # also ends the announcer when training stopped on an error
        claimed, replica = self.parts.claimed, self.parts.replica
        try:
            if claimed is not None:
                claimed.announcer.join()  # its last record must not land after "leaving"
            if claimed is not None and replica is not None:
                settle_to_leave(self.parts.synced, replica)
                self.served.save(replica)
                self.state = "leaving"
                claimed.announcer.announce(wait=True)
        except Exception as error:  # noqa: BLE001 (leaving must not hang or fail: the record expires anyway)
            logger.warning("could not announce leaving: %s", error)
        for close in reversed(self._closers):  # the averager, the loop and its P2P handle, the DHT
            close()
        if self._closers:
            logger.info("peer stopped")
