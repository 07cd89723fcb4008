"""`--sync demo-overlap`: DeMo whose exchange of step t runs while step t+1 computes.

As in DeMo's own trainer, the gathered update is applied one step late: at step t the
replica publishes its payload of t and starts gathering the others' (on the p2p loop), then
applies the set it gathered for t-1, which had the whole forward and backward pass of step t
to arrive. The trainer waits only when the network is slower than a step. Every replica
applies the same gathered set in the same order, one step late alike, so replicas that gather
the same sets stay bit-identical; the trust rules are those of lockstep DeMo (majority vote,
bounded values, steps believed only from a majority). Before each checkpoint, and when
training stops, the last step's set is applied (`finish`), so a checkpoint holds every step's
update up to its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.model.train import Trainer
from swarm.sync.exchange import Round
from swarm.sync.lockstep import DeMoSync


@dataclass
class DeMoOverlapSync(DeMoSync):
    """`--sync demo-overlap` (a `SyncStrategy`): lockstep DeMo's update, applied one step late."""

    pending: Round | None = None  # the exchange in flight: the step before the trainer's

    def update(self, trainer: Trainer) -> None:
        previous, self.pending = self.pending, self.exchange.start(trainer.step_count, self.own_payload(trainer))
        if previous is not None:
            self.apply(previous, trainer)

    def apply(self, round_: Round, trainer: Trainer) -> None:
        jumped_from = trainer.step_count
        super().apply(round_, trainer)
        if trainer.step_count != jumped_from:  # the exchange in flight is for a step the others have left
            self.pending = None

    def finish(self, trainer: Trainer) -> None:
        """Apply the last step's set, so that the weights hold every step's update. A wait here
        comes between steps, outside the trainer's compute time: it lowers utilisation as wall
        time already and is not counted again as waiting."""
        if self.pending is not None:
            last, self.pending, waited = self.pending, None, self.exchange.wait_seconds
            self.apply(last, trainer)
            self.exchange.wait_seconds = waited
