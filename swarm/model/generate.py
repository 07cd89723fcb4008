"""Text continuation of any length: repeated single passes, each appending G bytes to the prefix."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from swarm.model.denoiser import ModelConfig
from swarm.model.families import generate_span
from swarm.model.steps import BlockRunner, Sampling

PAD_BYTE = ord(" ")  # a prompt shorter than P bytes is left-padded with spaces
STEPS_PER_BLOCK = 4  # denoising steps of each block per span unless told (swarm-generate, swarm-bench)


def prefix_tensor(context: bytes, config: ModelConfig) -> torch.Tensor:
    """The last P bytes of the context (left-padded with spaces) as a (1, P) int64 tensor."""
    window = context[-config.prefix_len :].rjust(config.prefix_len, bytes([PAD_BYTE]))
    return torch.tensor(list(window), dtype=torch.long)[None]


def continue_text(
    run_block: BlockRunner,
    config: ModelConfig,
    prompt: bytes,
    max_bytes: int,
    steps_per_block: int = STEPS_PER_BLOCK,
    sampling: Sampling = Sampling(),  # noqa: B008 (a frozen dataclass: one shared default is safe)
    seed: int = 0,
) -> Iterator[bytes]:
    """Yield the continuation of `prompt` span by span (G bytes per pass, the last one cut to max_bytes).

    `run_block` runs the blocks here (`local_runner`) or on swarm peers (`RemoteBlocks`).
    """
    generator = torch.Generator().manual_seed(seed)
    context, written = prompt, 0
    while written < max_bytes:
        span, _ = generate_span(run_block, config, prefix_tensor(context, config), steps_per_block, generator, sampling)
        new = bytes(span[0].tolist())[: max_bytes - written]
        context, written = context + new, written + len(new)
        yield new
