"""`--sync outer`: H local AdamW steps, then one exchange of the compressed pseudo-gradient.

Between outer steps each replica trains alone (its own AdamW, its own batches) and nothing
crosses the network. At the end of a round (after steps H, 2H, ... of the step counter) it
publishes its payload (pseudo_gradient.py: the change since the anchor, with error feedback,
top-k per tile at 2 or 1 bits), gathers the others' for the same round through the same
exchange as DeMo (deadline, schema, per-peer limits, fingerprints, majority step), and takes
the outer step on what a majority vouches for (of two senders: where both agree, unless the
record shows the other contradicting); every replica's weights become the new anchor.
Rounds are named by the step that ends them, so a round number is a step, and a replica that
misses one (late, paused, or fed a different set) is noticed through the fingerprints at the
next round and brought back by the peer's parameter averaging, after which its anchor is its
averaged weights.

The round blocks the trainer for one gather every H steps; at H = 30 and a step of 0.5 s that
is one round trip per 15 s of compute, plus however far the slowest replica is behind.

`--sync outer-overlap` (`OuterOverlapSync`) does not block: it publishes its payload at the
end of a round and goes on with the next round's local steps; the outer step is applied at
the first step whose update finds the gather done, on top of the local steps taken since
(`OuterOptimizer.apply`'s `progress`). It waits for the gather at the latest a tenth of a round
after the round's end (`_overdue`): replicas that never waited would drift apart in time, a
slower one further behind each round, until its payload missed the others' deadline.
Replicas that apply the same sets hold the same anchor, whatever step each applied it at; at
a checkpoint the peer first settles the round in flight (`settle`), so that checkpoints, which
fall on round ends, hold the anchor itself and are identical across replicas, as `outer`'s are.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.model.train import Trainer
from swarm.sync.exchange import Exchange, Exchanging, Round
from swarm.sync.pseudo_gradient import Changes, OuterOptimizer


@dataclass
class OuterSync(Exchanging):
    """`--sync outer` (a `SyncStrategy`): the inner AdamW step, and an outer step every H steps."""

    optimizer: OuterOptimizer
    exchange: Exchange

    def update(self, trainer: Trainer) -> int | None:
        trainer.optimizer_step()
        step = trainer.step_count
        if not self._ends_round(step):
            return None
        return self.apply(self.exchange.start(step + 1, self.optimizer.make_payload()), step)

    def _ends_round(self, step: int) -> bool:
        return (step + 1) % self.optimizer.config.steps == 0

    def apply(self, round_: Round, step: int, progress: Changes | None = None) -> int | None:
        """Wait for a round's gather and take the outer step on its set, at the trainer's `step`;
        the step to continue from when a majority of the replicas is ahead."""
        def outer_step(decoded: list[tuple[str, Changes]]) -> list[str]:
            return self.optimizer.apply(decoded, self.exchange.own_id, progress)

        return self.exchange.finish(round_, step, self.optimizer.decode, outer_step, self.optimizer.config.steps)

    def averaged(self, step: int) -> None:
        """After parameter averaging the averaged weights are the anchor the next round starts from."""
        super().averaged(step)
        self.optimizer.reset()


@dataclass
class OuterOverlapSync(OuterSync):
    """`--sync outer-overlap` (a `SyncStrategy`): outer steps whose exchange runs while the next
    round's local steps compute (module docstring)."""

    pending: Round | None = None  # the round in flight
    sent_weights: Changes | None = None  # the weights its payload was made from

    def update(self, trainer: Trainer) -> int | None:
        trainer.optimizer_step()
        step, jump = trainer.step_count, None
        ends_round = self._ends_round(step)
        if self.pending is not None and (ends_round or self.pending.gathering.done() or self._overdue(step)):
            jump = self._apply_pending(step)
        if ends_round:  # a round of the step jumped to, if the one in flight jumped
            self.sent_weights = self.optimizer.weights()
            self.pending = self.exchange.start(step + 1 if jump is None else jump, self.optimizer.make_payload())
        return jump

    def _overdue(self, step: int) -> bool:
        """Whether the round in flight ended a tenth of a round ago (at least a step): then it is waited for."""
        return step + 1 - self.pending.step >= max(1, self.optimizer.config.steps // 10)

    def _apply_pending(self, step: int) -> int | None:
        """Apply the round in flight, keeping the local steps taken since its payload."""
        round_, sent_weights, self.pending, self.sent_weights = self.pending, self.sent_weights, None, None
        return self.apply(round_, step, self.optimizer.progress_since(sent_weights))

    def settle(self, trainer: Trainer) -> int | None:
        """The round in flight, applied between steps (as demo-overlap's `settle`: the wait is wall
        time outside the trainer's compute, not counted again as waiting)."""
        if self.pending is None:
            return None
        with self.exchange.between_steps():
            return self._apply_pending(trainer.step_count)

    def averaged(self, step: int) -> None:
        """Averaged weights already hold every replica's change of the round in flight (uncompressed):
        it is dropped, and the averaged weights are the anchor."""
        self.pending = None
        super().averaged(step)
