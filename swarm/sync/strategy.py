"""What every way of keeping a block's replicas in step offers the peer that runs it.

A strategy is the trainer's update (it replaces the plain AdamW step) plus the figures the
peer announces. The peer also runs periodic parameter averaging (`swarm.sync.dense`) and asks
the strategy whether it is needed: replicas that applied the same updates hold the same
weights and can skip it. The strategies: `NoSync` below (`--sync none`), `DenseSync`
(dense.py, `--sync dense`), `DeMoSync` (lockstep.py, `--sync demo`), `DeMoOverlapSync`
(overlap.py, `--sync demo-overlap`), `OuterSync` and `OuterOverlapSync` (outer.py, `--sync outer`,
`--sync outer-overlap`).

Bytes: a strategy counts what it sends over its own P2P exchange; what hivemind's averager
sends (dense gradient steps and every parameter round) is counted by the averager, and the
peer adds it once, whatever the strategy.
"""

from __future__ import annotations

from typing import Protocol

from swarm.model.train import Trainer


class SyncStrategy(Protocol):
    """The update a peer's trainer runs each step, and what it exchanged doing so."""

    steps: int  # steps (or outer rounds) exchanged with at least one other replica
    bytes_sent: int  # bytes sent to other replicas over the strategy's own exchange, in all
    bytes_received: int  # bytes received from them, in all
    round_seconds: float | None  # how long the last exchange took
    wait_seconds: float  # how long the trainer's updates waited on other replicas, in all

    def update(self, trainer: Trainer) -> None:
        """The optimizer step of one training step (on the trainer's thread, the only one that
        touches the live weights)."""

    def finish(self, trainer: Trainer) -> None:
        """Apply whatever is still in flight: the peer calls it before every checkpoint and when
        training ends."""

    def may_have_drifted(self) -> bool:
        """Whether this replica's weights may differ from the others' (then a parameter round is due)."""

    def averaged(self, step: int) -> None:
        """The replicas averaged their parameters at `step`: they hold the same weights again."""


class NoSync:
    """`--sync none`: each replica takes its own AdamW steps; only parameter rounds bring them together."""

    steps = bytes_sent = bytes_received = 0
    round_seconds = None
    wait_seconds = 0.0

    def update(self, trainer: Trainer) -> None:
        trainer.optimizer.step()

    def finish(self, trainer: Trainer) -> None:
        pass

    def may_have_drifted(self) -> bool:
        return True

    def averaged(self, step: int) -> None:
        pass
