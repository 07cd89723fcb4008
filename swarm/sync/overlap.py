"""`--sync demo-overlap`: DeMo whose exchange of step t runs while step t+1 computes.

As in DeMo's own trainer, the gathered update is applied one step late: at step t the
replica publishes its payload of t and starts gathering the others' (on the p2p loop), then
applies the set it gathered for t-1, which had the whole forward and backward pass of step t
to arrive. The trainer waits only when the network is slower than a step. With
`--overlap-steps D` the set of t is applied at step t+D instead: D steps of compute for the
exchange to arrive in, so a replica that runs a little behind the others (a busy core, a
far region) does not stall them, for an update D steps stale. Every replica
applies the same gathered set in the same order, D steps late alike (replicas of a block
must run the same D), so replicas that gather
the same sets stay bit-identical; the trust rules are those of lockstep DeMo (a majority's clipped mean,
bounded values, steps believed only from a majority). Before each checkpoint, and when
training stops, the sets still in flight are applied (`settle`), so a checkpoint holds every step's
update up to its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from swarm.model.train import Trainer
from swarm.sync.exchange import Round
from swarm.sync.lockstep import DeMoSync


@dataclass
class DeMoOverlapSync(DeMoSync):
    """`--sync demo-overlap` (a `SyncStrategy`): lockstep DeMo's update, applied `late_steps` steps late."""

    late_steps: int = 1
    pending: deque[Round] = field(default_factory=deque)  # the exchanges in flight, oldest first

    def update(self, trainer: Trainer) -> int | None:
        self.pending.append(self.exchange.start(trainer.step_count, self.own_payload(trainer)))
        if len(self.pending) > self.late_steps:
            return self.apply(self.pending.popleft(), trainer.step_count)
        return None

    def apply(self, round_: Round, step: int) -> int | None:
        jump = super().apply(round_, step)
        if jump is not None:  # the exchanges in flight are for steps the others have left
            self.pending.clear()
        return jump

    def settle(self, trainer: Trainer) -> int | None:
        """Apply the sets still in flight, so that the weights hold every step's update. A wait
        here comes between steps, outside the trainer's compute time: it lowers utilisation as
        wall time already and is not counted again as waiting."""
        jump = None
        with self.exchange.between_steps():
            while self.pending:
                jump = self.apply(self.pending.popleft(), trainer.step_count)
        return jump
