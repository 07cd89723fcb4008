"""`--sync demo`: DeMo in lockstep, each step's gathered set applied in the same step.

The trainer folds its gradient into the DeMo momentum, publishes its payload, and waits for
the other replicas' payloads of the same step (up to the deadline) before it takes the
step; the network time of every step is time the trainer does not compute. `--sync
demo-overlap` (overlap.py) hides it; this one stays as the baseline it is measured against.
The step's rate follows the trainer's schedule (`DeMoOptimizer.rate`), so it is in the
fingerprint of what a replica applied: replicas whose schedules differ (another --max-steps)
step differently on the same set, and notice it as drift.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.model.train import Trainer
from swarm.sync.decoupled_momentum import DeMoOptimizer, Payload, decode_payload, encode_payload
from swarm.sync.exchange import Exchange, Exchanging, Round


@dataclass
class DeMoSync(Exchanging):
    """`--sync demo` (a `SyncStrategy`): the trainer's update when the block has replicas."""

    optimizer: DeMoOptimizer
    exchange: Exchange

    def update(self, trainer: Trainer) -> int | None:
        round_ = self.exchange.start(trainer.step_count, self.own_payload(trainer))
        return self.apply(round_, trainer.step_count)

    def own_payload(self, trainer: Trainer) -> bytes:
        """This step's gradient folded into the momentum; what is shared, on the wire."""
        return encode_payload(self.own_update(trainer), self.optimizer.config.value_bits)

    def own_update(self, trainer: Trainer) -> Payload:
        """This step's gradient folded into the momentum; what is shared (`own_payload` encodes it)."""
        return self.optimizer.make_payload(trainer.config.lr_at(trainer.step_count))

    def apply(self, round_: Round, step: int) -> int | None:
        """Wait for a round's gather and take the step on its set, at the trainer's `step`;
        the step to continue from when a majority of the replicas is ahead."""
        return self.exchange.finish(round_, step, self._decode, self._vote, how=f"rate {self.optimizer.rate.hex()}")

    def _vote(self, decoded: list[tuple[str, Payload]]) -> list[str]:
        return self.optimizer.apply(decoded, self.exchange.own_id)

    def _decode(self, data: bytes) -> Payload:
        return decode_payload(data, self.optimizer)
