"""What a block runs, wherever it runs: the runner type both families share, and the byte choice.

A pass through the swarm hands each block in turn the span's state (the gaussian family's noisy
embeddings, the masked family's byte ids), a schedule of noise levels inside the block's slice,
a seed for the block's own draws and a temperature; the block answers with the new state and
logits. `local_runner` runs every block in this process; `swarm.serving.remote.RemoteBlocks`
runs each on a swarm peer, with the same signature.
"""

from __future__ import annotations

from typing import Callable

import torch

from swarm.model.denoiser import VOCAB_SIZE, Denoiser

DenoiserForBlock = Callable[[int], Denoiser]
LossFn = Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # (windows, generator) -> training loss
# (block, prefix, state, schedule, seed, temperature) -> (state after the block's steps, logits)
BlockRunner = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, int, float], tuple[torch.Tensor, torch.Tensor]]
# (denoiser, prefix, state, schedule, seed, temperature) -> (state, logits): one family's block steps
BlockSteps = Callable[[Denoiser, torch.Tensor, torch.Tensor, torch.Tensor, int, float], tuple[torch.Tensor, torch.Tensor]]


def pick_bytes(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Argmax at temperature 0, else one sample per position from softmax(logits / temperature).

    The sample is drawn on the generator's device and returned on the logits': a block on a GPU
    draws from the same CPU stream as a replica on a CPU, so that both write the same bytes.
    """
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = (logits / temperature).softmax(dim=-1).reshape(-1, VOCAB_SIZE).to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1]).to(logits.device)
