"""Text continuation of any length: repeated single passes, each appending G units to the prefix."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from swarm.model.denoiser import ModelConfig
from swarm.model.families import generate_span
from swarm.model.steps import BlockRunner, Sampling
from swarm.model.units import Units

PAD_TEXT = " "  # a prompt shorter than P units is left-padded with the units of a space
STEPS_PER_BLOCK = 4  # denoising steps of each block per span unless told (swarm-generate, swarm-eval, swarm-bench)


def encode_prompt(prompt: bytes | str, units: Units) -> list[int]:
    """A prompt's units. Bytes that are not UTF-8 stay themselves with raw byte units; a tokenizer
    reads text, so it sees them replaced (U+FFFD), the one lossy case."""
    if isinstance(prompt, bytes):
        return units.encode(prompt.decode("utf-8", errors="replace")) if units.sha256 else list(prompt)
    return units.encode(prompt)


def prefix_tensor(context: bytes | str | list[int], config: ModelConfig) -> torch.Tensor:
    """The last P units of the context (a prompt, or units already), left-padded with the units
    of a space, as a (1, P) int64 tensor."""
    units = config.units()
    ids = context if isinstance(context, list) else encode_prompt(context, units)
    pad = units.encode(PAD_TEXT)[-1]
    window = [pad] * max(0, config.prefix_len - len(ids)) + ids[-config.prefix_len :]
    return torch.tensor(window, dtype=torch.long)[None]


def continue_text(
    run_block: BlockRunner,
    config: ModelConfig,
    prompt: bytes | str,
    max_bytes: int,
    steps_per_block: int = STEPS_PER_BLOCK,
    sampling: Sampling = Sampling(),  # a frozen dataclass: one shared default is safe
    seed: int = 0,
) -> Iterator[bytes]:
    """Yield the continuation of `prompt` span by span (the bytes of G units per pass, the last one
    cut to max_bytes in all).

    The context stays as units: what a pass writes is appended as it was written, never
    re-tokenized, so a span's last unit may end inside a character that the next span finishes.
    `run_block` runs the blocks here (`local_runner`) or on swarm peers (`RemoteBlocks`).
    """
    generator, units = torch.Generator().manual_seed(seed), config.units()
    context, written = encode_prompt(prompt, units), 0
    while written < max_bytes:
        span, _ = generate_span(run_block, config, prefix_tensor(context, config), steps_per_block, generator, sampling)
        context += span[0].tolist()
        new = units.decode(span[0].tolist())[: max_bytes - written]
        written += len(new)
        yield new
