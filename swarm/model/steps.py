"""What a block runs, wherever it runs: the runner type both families share, and the byte choice.

A pass through the swarm hands each block in turn the span's state (the gaussian family's noisy
embeddings, the masked family's byte ids), a schedule of noise levels inside the block's slice,
a seed for the block's own draws and the `Sampling` settings; the block answers with the new
state and logits. `local_runner` runs every block in this process; `swarm.serving.remote.RemoteBlocks`
runs each on a swarm peer, with the same signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from swarm.model.denoiser import Denoiser

DenoiserForBlock = Callable[[int], Denoiser]
LossFn = Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # (windows, generator) -> training loss
Reveal = Literal["confident", "random", "leftmost"]
REVEAL_ORDERS: tuple[str, ...] = get_args(Reveal)
MAX_TEMPERATURE = 100.0
# Measured on the long run's blocks (benchmarks/results/long_run, `blocks_by_temperature`): the argmax
# repeats itself (distinct words 0.78 of the true text's, word entropy 0.41 of it); at 0.8 the samples
# have 0.94 of the true text's distinct words and 0.78 of its word entropy, and the AR judge finds them
# 1.06x as unlikely as the true continuations; at 1.0, 1.22x (word soup creeps back in)
DEFAULT_TEMPERATURE = 0.8
# Measured on the demo's start model at 0.8 (benchmarks/results/start_model, `by_reveal`): leftmost order
# writes 0.99 of the true text's distinct words and 0.91 of its word entropy, the AR judge finding it 1.10x
# as unlikely; confident order 0.95, 0.79 and 0.85x (likelier, but repeating common words); random order
# 0.99, 0.94 and 1.21x. Leftmost is also the order whose likelihood is exact (swarm/model/masked.py
# `leftmost_nll`): at temperature 1 it writes from the distribution the model's bits per byte measure.
DEFAULT_REVEAL: Reveal = "leftmost"


@dataclass(frozen=True)
class Sampling:
    """How a block chooses bytes: settings of the sampler, not of the model, so that one set of
    weights can be asked either way; they travel in every remote request, because replicas of a
    checkpoint agree only when they sample alike.

    `temperature` 0 takes the argmax; the default, DEFAULT_TEMPERATURE, draws from the softened
    logits (why: beside the constant). `reveal` is which hidden bytes a masked step shows (the
    gaussian family reveals nothing step by step, so it ignores it): "random" draws them, each
    with the probability of the ancestral step; "confident" shows as many as keep the hidden share
    on the training path, the ones the block is surest of; "leftmost" as many, the earliest in the
    span. Leftmost is the default (DEFAULT_REVEAL, why: beside it).
    """

    temperature: float = DEFAULT_TEMPERATURE
    reveal: Reveal = DEFAULT_REVEAL

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:  # also false for NaN
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], not {self.temperature}")
        if self.reveal not in REVEAL_ORDERS:
            raise ValueError(f"reveal must be one of {', '.join(REVEAL_ORDERS)}, not {self.reveal!r}")


# (block, prefix, state, schedule, seed, sampling) -> (state after the block's steps, logits)
BlockRunner = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, int, Sampling],
                       tuple[torch.Tensor, torch.Tensor]]
# (denoiser, prefix, state, schedule, seed, sampling) -> (state, logits): one family's block steps
BlockSteps = Callable[[Denoiser, torch.Tensor, torch.Tensor, torch.Tensor, int, Sampling],
                      tuple[torch.Tensor, torch.Tensor]]


def pick_bytes(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Argmax at temperature 0 (and at one so small that logits / temperature overflows: the limit
    of the draw), else one sample per position from softmax(logits / temperature).

    The sample is drawn on the generator's device and returned on the logits': a block on a GPU
    draws from the same CPU stream as a replica on a CPU, so that both write the same bytes.
    """
    if temperature <= 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    # a temperature so small that finite logits overflow (1e-45, say): softmax would give NaN, which
    # torch.multinomial refuses with a RuntimeError; the draw's limit there is the argmax
    if not torch.isfinite(scaled).all() and torch.isfinite(logits).all():
        return logits.argmax(dim=-1)
    probs = scaled.softmax(dim=-1).reshape(-1, logits.shape[-1]).to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1]).to(logits.device)
