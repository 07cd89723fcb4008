"""Evidence of descent: is a vote's update clearly worse than this replica's own, on text no key has seen?

In an open swarm keys are free, so k keys beside a lone replica are a majority of its outer vote.
`keeps_own` (evidence.py) sets aside a vote that keeps no more than a tenth of own's update, but a
vote is a claim about direction and that check is geometry: keys that send own's change with the
signs of its largest 10% of values flipped, or only its largest 5% or 15% of values, leave own
more than a tenth and still cost it 1.05x to 1.12x of its loss alone (benchmarks/sync_vote.py,
issue 57). What no key can fake is the loss. So, as Templar's Gauntlet scores each update on a
held-out batch, a replica measures its block twice on a batch it draws in private: windows of
the validation split, which no replica trains on, chosen each round from those its spot check
drew at a private seed, and noise draws from a private seed, fresh each round. Once as the vote's
update would leave it, once as its own update alone would. The batch is cut into `CHUNKS` paired
chunks (the same windows and draws on both sides), and the vote is set aside for own's update
alone only when it is worse by more than `Z` standard errors of the chunks' differences.

Why `Z` is 6, not 2 or 3: honest replicas' vote (the majority's clipped mean) is on average a
little worse on held-out text than a replica's own update alone, in an exploration before this
module's settings (block 1 of benchmarks/sync.py's small model, 5 local steps a round, 60 rounds
of 3, 4 and 8 replicas, 128 windows in 8 chunks: z of 0.6 to 0.8 on average, at most 3.4, 4.0 and
4.2), so at 3 honest replicas parted within 5 rounds. Keys' turns of a lone replica's change
measured 10 to 39 in every round (largest 10% of signs flipped, largest 5% or 15% alone). The
shipped 16 chunks of 8 (15 degrees of freedom, a thinner tail than 8 chunks' 7) were measured only
through benchmarks/sync_vote.py: no honest vote set aside, every such turn set aside.
What keys can still do: a turn that costs less than 6 standard errors in each round (honest votes
reach 4), every round; none such was tried. Whether a vote was set aside shows in the replicas'
fingerprints, so keys learn about a bit a round about the private windows (drawn anew from 256
each round, with fresh noise).

What it costs: two forward passes over `WINDOWS` windows each outer round (every H local steps).
What it does not see: an update that is worse only where this batch does not look (the windows
and draws are private and change each round, so a key has nothing fixed to aim at), and a vote
worse by less than the test can tell in one round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from swarm.model.denoiser import Denoiser
from swarm.model.families import family_of

WINDOWS = 128  # held-out windows measured on each side, each round
CHUNKS = 16  # the batch's chunks of 8 windows: paired differences, from which the standard error comes
Z = 6.0  # standard errors by which the vote must be worse before it is set aside (module docstring)
Changes = Mapping[str, torch.Tensor]


class DescentProbe:
    """Measures what an outer update would do to `module` on held-out windows at private draws.

    Args:
        module: the replica's block (its parameters are set, measured and left as set: the caller
            sets them again right after, as an outer step does).
        held_out: (count, length) windows of text no replica trains on (the validation split), count
            at least `WINDOWS`: the peer passes its spot check's, drawn at a private seed.
        block: the block's index (its slice of noise).
        seed: the private seed of the batches and noise draws (the caller draws it: spot_check.private_seed).
    """

    def __init__(self, module: Denoiser, held_out: torch.Tensor, block: int, seed: int):
        if len(held_out) < WINDOWS:
            raise ValueError(f"a descent probe measures {WINDOWS} held-out windows a round, not {len(held_out)}")
        self.module, self.held_out = module, held_out
        self.generator = torch.Generator().manual_seed(seed)
        self.params = dict(module.named_parameters())
        self.loss_fn = family_of(module.config).training_loss(module, block, stratified=True)
        self.last_z: float | None = None  # the last comparison's z (logged by the caller, shown in tests)

    @torch.no_grad()
    def vote_is_worse(self, anchor: Changes, vote: Changes, own: Changes, rate: float) -> bool:
        """Whether `anchor - rate * vote` measures worse than `anchor - rate * own` by more than `Z`
        standard errors, on one fresh private batch (the same windows and draws on both sides)."""
        chosen = torch.randperm(len(self.held_out), generator=self.generator)[:WINDOWS]
        windows = self.held_out[chosen].to(next(iter(self.params.values())).device)
        seeds = [int(s) for s in torch.randint(0, 2**62, (CHUNKS,), generator=self.generator)]
        voted, alone = (self._chunk_losses(anchor, update, rate, windows, seeds) for update in (vote, own))
        differences = voted - alone
        self.last_z = float(differences.mean() / (differences.std() / math.sqrt(CHUNKS)).clamp_min(1e-12))
        return not self.last_z <= Z  # a NaN (a loss that is no number) is no evidence for the vote

    def _chunk_losses(self, anchor: Changes, update: Changes, rate: float, windows: torch.Tensor,
                      seeds: list[int]) -> torch.Tensor:  # fmt: skip
        """Each chunk's mean loss with the parameters at `anchor - rate * update`."""
        for name, param in self.params.items():
            torch.sub(anchor[name], update[name], alpha=rate, out=param.data)
        was_training = self.module.training
        self.module.eval()
        try:
            return torch.stack([self.loss_fn(chunk, torch.Generator().manual_seed(seed)).float()
                                for chunk, seed in zip(windows.chunk(CHUNKS), seeds)])  # fmt: skip
        finally:
            self.module.train(was_training)
