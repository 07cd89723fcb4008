"""The running peer's loop: its steps, its saves, and the rounds that keep the block's replicas together.

Its own module because after the join this loop is the one writer of the block's live weights
(on the main thread: life.py says who may touch them): a step, a settle of what the sync still
has in flight, a save, a reconcile round. It reads the join's parts and writes only the weights
and the checkpoint the peer serves (`Served`, served.py).
"""

from __future__ import annotations

import logging
import threading

from swarm.peer.config import PeerConfig
from swarm.peer.parts import Joined, Replica, Synced
from swarm.peer.served import Served
from swarm.sync.strategy import train_step

logger = logging.getLogger(__name__)


class TrainingLoop:
    """The steps of a joined peer, until `stopping` or `max_steps`; each save replaces `served`."""

    def __init__(self, config: PeerConfig, joined: Joined, stopping: threading.Event, served: Served):
        self.config, self.joined, self.stopping, self.served = config, joined, stopping, served

    def run(self) -> int:
        """Step until stopped or `max_steps`, saving every `save_every` steps and at the end; returns
        the steps trained. `max_steps` is where the step it started at plus the steps it trained
        reach: a jump (swarm/sync/exchange.py) moves the step counter, and so the schedule, but never
        ends a run, whatever the replicas that report a step ahead claim. Before each save the sync
        applies what it still has in flight (an overlapped strategy is an update behind): a
        checkpoint holds every update up to its step, and replicas that applied the same ones save
        the same bytes."""
        replica, sync = self.joined.replica, self.joined.synced.sync
        trainer = replica.trainer
        started, trained = trainer.step_count, 0
        # the moment the first step starts (benchmarks/time_to_loss.py times each save from it)
        logger.info("block %d: training from step %d", self.joined.claimed.block, trainer.step_count)
        while not self.stopping.is_set():
            if self.config.max_steps is not None and started + trained >= self.config.max_steps:
                break
            train_step(trainer, sync)
            trained += 1
            self._keep_replicas_together()
            if trainer.step_count % self.config.save_every == 0:
                self._settle()
                self.served.save(replica)
        self._settle()
        self.served.save(replica)
        return trained

    def _settle(self) -> None:
        """Apply what the sync still has in flight; continue from the step it returns, if a
        majority of the replicas turned out to be ahead."""
        trainer = self.joined.replica.trainer
        continue_from = self.joined.synced.sync.settle(trainer)
        if continue_from is not None:
            trainer.step_count = continue_from

    def _keep_replicas_together(self) -> None:
        """Every `average_every` steps, if a round is due (reconcile.py `ReconcileRound.due`: in an open
        swarm always; where keys count, if the replicas may have drifted apart: always for dense and
        none, for the payload modes only when a replica applied other payloads than the rest): save
        and announce this step's checkpoint, then merge with the other replicas' checkpoints of the
        step that measure as well as this one (swarm/sync/reconcile.py)."""
        joined, served = self.joined, self.served
        trainer, sync, reconcile = joined.replica.trainer, joined.synced.sync, joined.synced.reconcile
        if reconcile is None or trainer.step_count % self.config.average_every != 0:
            return
        announcer = joined.claimed.announcer
        replicas = len(announcer.replica_ids())
        if not replicas or not reconcile.due(sync.may_have_drifted):
            return
        self._settle()
        served.save(joined.replica)
        if served.checkpoint is None or served.checkpoint.step != trainer.step_count:
            return  # the disk refused this step's checkpoint: the next round tries again
        announcer.announce(wait=True)
        # the record just announced: its lineage says whose voice this checkpoint is (reconcile.py `weigh`)
        if reconcile.run(trainer.module, announcer.record(), replicas) is not None:
            sync.averaged(trainer.step_count)


def settle_to_leave(synced: Synced | None, replica: Replica) -> None:
    """Before the last save, apply what the sync still has in flight, as every save does (after
    `TrainingLoop.run`, nothing is; after an error in it, an overlapped strategy may hold steps
    ahead). Failing here (the exchange may be what failed) leaves the weights as settle left them."""
    if synced is None:
        return
    try:
        synced.sync.settle(replica.trainer)
    except Exception as error:  # noqa: BLE001 (leaving must not fail: the save still runs)
        logger.warning("could not apply the updates in flight before leaving: %s", error)
