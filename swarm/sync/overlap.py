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

The step ahead: while its sets are in flight, the replica computes its gradients on its weights
plus its own updates of those steps (`DeMoOptimizer.apply_alone`), not on weights D steps
behind. Without it the next gradient still asks for what the late set is about to do, the
momentum sends it again, and the update overshoots: in one process (4 replicas of block 1 of
benchmarks/sync.py's small model, batch 32, constant rate), validation loss after 100 / 400
steps was 7.734 / 7.297 one step late, 7.352 / 7.199 with the step ahead, 7.223 / 6.972 in
lockstep: better, not yet lockstep's (issue 47's notes). The weights before the steps ahead
are kept (`behind`, one copy of the block) and put back once a set's gather is in, just before
the set is applied (spare batches computed while waiting are taken ahead too), so every replica
applies each set to the same weights and they stay bit-identical; `settle` puts them back as
well, so a checkpoint holds no step ahead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from swarm.model.train import Trainer
from swarm.sync.decoupled_momentum import Payload, encode_payload
from swarm.sync.exchange import Round
from swarm.sync.lockstep import DeMoSync


@dataclass
class DeMoOverlapSync(DeMoSync):
    """`--sync demo-overlap` (a `SyncStrategy`): lockstep DeMo's update, applied `late_steps` steps
    late, with the replica's own updates of the steps in flight taken ahead meanwhile (`ahead`:
    the weights hold them; `behind`: the weights without them, one copy of the block)."""

    late_steps: int = 1
    pending: deque[Round] = field(default_factory=deque)  # the exchanges in flight, oldest first
    own: deque[Payload] = field(default_factory=deque)  # this replica's payload of each, in the same order
    behind: dict[str, torch.Tensor] = field(default_factory=dict)  # the weights before the steps ahead
    ahead: bool = False  # whether the weights hold steps ahead now

    def update(self, trainer: Trainer) -> int | None:
        payload = self.own_update(trainer)
        value_bits = self.optimizer.config.value_bits
        self.pending.append(self.exchange.start(trainer.step_count, encode_payload(payload, value_bits)))
        self.own.append(payload)
        if len(self.pending) <= self.late_steps:  # no set due: the newest own update goes on top
            self._step_ahead([payload])
            return None
        self.own.popleft()
        jump = self.apply(self.pending.popleft(), trainer.step_count)  # steps back once the set is in (`_vote`)
        self._step_back()  # (already back, unless the set was never voted on)
        self._step_ahead(self.own)
        return jump

    def apply(self, round_: Round, step: int) -> int | None:
        jump = super().apply(round_, step)
        if jump is not None:  # the exchanges in flight are for steps the others have left
            self.pending.clear()
            self.own.clear()
        return jump

    def _vote(self, decoded: list[tuple[str, Payload]]) -> list[str]:
        """Back to the weights every replica shares, then the set's step. Only now, after the
        gather: the spare batches computed while waiting for it are taken at the weights ahead."""
        self._step_back()
        return super()._vote(decoded)

    @torch.no_grad()
    def _step_ahead(self, payloads: Iterable[Payload]) -> None:
        """Keep the weights as they are unless already ahead, then take these own updates."""
        payloads = list(payloads)
        if not payloads:
            return
        if not self.ahead:
            for name, param in self.optimizer.params.items():  # the same buffers every step
                if name in self.behind:
                    self.behind[name].copy_(param)
                else:
                    self.behind[name] = param.detach().clone()
            self.ahead = True  # before any step: one that fails halfway is still put back
        for payload in payloads:
            self.optimizer.apply_alone(payload)

    @torch.no_grad()
    def _step_back(self) -> None:
        """Put back the weights from before the steps ahead, if any were taken."""
        if self.ahead:
            for name, param in self.optimizer.params.items():
                param.copy_(self.behind[name])
            self.ahead = False

    def settle(self, trainer: Trainer) -> int | None:
        """Apply the sets still in flight, so that the weights hold every step's update. A wait
        here comes between steps, outside the trainer's compute time: it lowers utilisation as
        wall time already and is not counted again as waiting. The copy of the weights kept for
        the steps ahead is let go (the next step makes it again; a peer done training holds none)."""
        jump = None
        self._step_back()
        self.behind.clear()
        with self.exchange.between_steps():
            while self.pending:
                self.own.popleft()
                jump = self.apply(self.pending.popleft(), trainer.step_count)
        return jump
