"""`--sync outer`: H local AdamW steps, then one exchange of the compressed pseudo-gradient.

Between outer steps each replica trains alone (its own AdamW, its own batches) and nothing
crosses the network. At the end of a round (after steps H, 2H, ... of the step counter) it
publishes its payload (pseudo_gradient.py: the change since the anchor, with error feedback,
top-k per chunk at 2 or 1 bits), gathers the others' for the same round through the same
exchange as DeMo (deadline, schema, per-peer limits, fingerprints, majority step), and takes
the outer step on what a majority vouches for; every replica's weights become the new anchor.
Rounds are named by the step that ends them, so a round number is a step, and a replica that
misses one (late, paused, or fed a different set) is noticed through the fingerprints at the
next round and brought back by the peer's parameter averaging, after which its anchor is its
averaged weights.

The round blocks the trainer for one gather every H steps; at H = 30 and a step of 0.5 s that
is one round trip per 15 s of compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.model.train import Trainer
from swarm.sync.exchange import Exchange, Exchanging
from swarm.sync.pseudo_gradient import OuterReplica


@dataclass
class OuterSync(Exchanging):
    """`--sync outer` (a `SyncStrategy`): the inner AdamW step, and an outer step every H steps."""

    replica: OuterReplica
    exchange: Exchange

    def update(self, trainer: Trainer) -> None:
        trainer.optimizer.step()
        ends_round = trainer.step_count + 1
        if ends_round % self.replica.config.steps != 0:
            return
        round_ = self.exchange.start(ends_round, self.replica.make_payload())
        gathered = self.exchange.finish(round_)
        decoded = self.exchange.in_order(round_, gathered, self.replica.decode)
        self.replica.apply([changes for _, changes in decoded])
        self.exchange.applied_set(round_, [peer_id for peer_id, _ in decoded])
        self.exchange.follow_majority(gathered, trainer)

    def averaged(self, step: int) -> None:
        """After parameter averaging the averaged weights are the anchor the next round starts from."""
        super().averaged(step)
        self.replica.reset()
