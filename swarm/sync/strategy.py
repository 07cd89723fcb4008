"""What every way of keeping a block's replicas in step offers the peer that runs it.

A strategy is the update of a training step plus the figures the peer announces. The peer's
loop (`train_step` below) computes the step's gradients (`Trainer.compute_gradients`), hands
the trainer to the strategy's `update` (AdamW, the strategy's own step, or both), and ends the
step (`Trainer.end_step`) with what `update` returned: None, or the step to continue from when
a majority of the replicas is ahead. A strategy reads the trainer and may call its
`optimizer_step()`; it never writes the trainer's fields. The peer also runs periodic
merges of the replicas' checkpoints (swarm/sync/reconcile.py) and asks the strategy whether one
is needed: replicas that applied the same updates hold the same weights and can skip it. The strategies: `NoSync`
below, `DenseSync` (dense.py), `DeMoSync` (lockstep.py), `DeMoOverlapSync` (overlap.py),
`OuterSync` and `OuterOverlapSync` (outer.py); modes.py names each `--sync` mode and builds
its strategy.

Bytes: a strategy counts what it sends over its own payload exchange; what hivemind's averager
sends (`--sync dense`'s gradient steps) is counted by the averager, and the peer adds it once.
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

    def update(self, trainer: Trainer) -> int | None:
        """The update of one training step, on the gradients the trainer holds (on the trainer's
        thread, the only one that touches the live weights); the step to continue from when a
        majority of the replicas is ahead, else None."""

    def settle(self, trainer: Trainer) -> int | None:
        """Apply whatever is still in flight: the peer calls it between steps, before every
        checkpoint and when training ends; returns a step to continue from as `update` does."""

    def may_have_drifted(self) -> bool:
        """Whether this replica's weights may differ from the others' (then a parameter round is due)."""

    def averaged(self, step: int) -> None:
        """The replicas averaged their parameters at `step`: they hold the same weights again."""


class NoSync:
    """`--sync none`: each replica takes its own AdamW steps; only parameter rounds bring them together."""

    steps = bytes_sent = bytes_received = 0
    round_seconds = None
    wait_seconds = 0.0

    def update(self, trainer: Trainer) -> int | None:
        trainer.optimizer_step()
        return None

    def settle(self, trainer: Trainer) -> int | None:
        return None

    def may_have_drifted(self) -> bool:
        return True

    def averaged(self, step: int) -> None:
        pass


def train_step(trainer: Trainer, sync: SyncStrategy) -> float:
    """One training step with `sync`'s update (the peer's loop, and replicas run in one process):
    the gradients, the update, and the step ended where the update says; returns its loss."""
    open_step = trainer.compute_gradients()
    return trainer.end_step(open_step, sync.update(trainer))
