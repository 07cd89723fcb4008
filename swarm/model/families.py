"""The model families, behind one interface: what kind of noise the blocks remove.

- "masked" (masked.py): absorbing-state diffusion over byte ids, noise level the mask rate t;
- "gaussian" (diffusion.py): EDM-style diffusion of a fixed byte codebook's embeddings.

A family knows its noise: the training loss of a block on its slice, the figures of a block on
fixed draws (`block_loss`, the spot check's figure, and `block_elbo`, its share of the bound
on the likelihood), the steps a block runs for a generation request (`run_steps`) and what
such a request may hold (`check_state`, `check_schedule`), and the pass through all blocks
(`generate_span`). Everything else (blocks, trainers, checkpoints, sync, serving) is the same
for both. The config's `family` field picks one, so the config hash covers it.

`run_steps` runs on its denoiser's device and in its dtype, wherever its inputs are, and answers
on the device of the state it was given: a peer computes on its GPU while requests, spans and
the wire stay on the CPU.
"""

from __future__ import annotations

from typing import Protocol

import torch

from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.model.diffusion import GaussianFamily
from swarm.model.masked import MaskedFamily
from swarm.model.steps import BlockRunner, DenoiserForBlock, LossFn, Sampling


class Family(Protocol):
    name: str

    def training_loss(self, denoiser: Denoiser, block: int | None, stratified: bool = False) -> LossFn: ...

    def block_loss(self, denoiser: Denoiser, block: int, windows: torch.Tensor, points: int, seed: int) -> float: ...

    def block_elbo(self, denoiser: Denoiser, block: int, windows: torch.Tensor, points: int, seed: int) -> float: ...

    def schedule(self, block: int, steps: int) -> torch.Tensor: ...

    def run_steps(self, denoiser: Denoiser, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor,
                  seed: int, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]: ...  # fmt: skip

    def generate_span(self, run_block: BlockRunner, prefix: torch.Tensor, steps_per_block: int,
                      generator: torch.Generator,
                      sampling: Sampling = Sampling()) -> tuple[torch.Tensor, torch.Tensor]: ...  # fmt: skip

    def check_state(self, state: torch.Tensor, n: int) -> None: ...

    def check_schedule(self, schedule: torch.Tensor) -> None: ...

    def check_answer(self, state: torch.Tensor, schedule: torch.Tensor, answer: torch.Tensor) -> None: ...


FAMILY_CLASSES = {"gaussian": GaussianFamily, "masked": MaskedFamily}


def family_of(config: ModelConfig) -> Family:
    return FAMILY_CLASSES[config.family](config)


def local_runner(denoiser_for_block: DenoiserForBlock, config: ModelConfig) -> BlockRunner:
    """Run each block in this process. `denoiser_for_block(b)` is the denoiser that owns block
    b's slice: block b itself, or the end-to-end model for every b."""
    family = family_of(config)

    def run(block: int, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor, seed: int,
            sampling: Sampling):
        return family.run_steps(denoiser_for_block(block), prefix, state, schedule, seed, sampling)

    return run


def generate_span(
    run_block: BlockRunner,
    config: ModelConfig,
    prefix: torch.Tensor,
    steps_per_block: int,
    generator: torch.Generator,
    sampling: Sampling = Sampling(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass through the B blocks: G bytes for each prefix (N, P), and the logits they came from.

    Every random draw comes from `generator` (or from seeds drawn from it), here, wherever the
    blocks run, so a remote pass gives the same bytes as a local one with the same weights and
    seed.
    """
    return family_of(config).generate_span(run_block, prefix, steps_per_block, generator, sampling)
