"""Diffusion in embedding space: the codebook, the noise partition, the loss and the sampler.

A clean target is y0 = T[y] for a fixed codebook T (256 x d); a noisy one is
z = y0 + sigma * eps. log sigma ~ Normal(p_mean, p_std) clipped to [sigma_min, sigma_max] is
cut into B intervals of equal probability mass; block 0 owns the highest noise. Each block
trains only on its own (slightly widened) interval, and generation runs the blocks in order,
each taking K Euler steps inside its own interval.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from swarm.model.denoiser import VOCAB_SIZE, Denoiser, ModelConfig


def make_codebook(config: ModelConfig) -> torch.Tensor:
    """The fixed target codebook (256 x d): random rows scaled to RMS sigma_data, from the config's seed."""
    generator = torch.Generator().manual_seed(config.codebook_seed)
    rows = torch.randn(VOCAB_SIZE, config.d_model, generator=generator)
    return rows / rows.pow(2).mean(dim=1, keepdim=True).sqrt() * config.sigma_data


class NoisePartition:
    """Equal-mass intervals of the truncated log-normal noise distribution, one per block.

    Positions inside the distribution are given as mass fractions q in [0, 1] (q = 0 at
    sigma_min); block b owns q in [1 - (b + 1) / B, 1 - b / B].
    """

    def __init__(self, config: ModelConfig):
        self.config = config
        self._cdf_lo = self._normal_cdf(config.sigma_min)
        self._cdf_hi = self._normal_cdf(config.sigma_max)

    def _normal_cdf(self, sigma: float) -> torch.Tensor:
        log_sigma = torch.tensor(sigma, dtype=torch.float64).log()
        return torch.special.ndtr((log_sigma - self.config.p_mean) / self.config.p_std)

    def sigma_at(self, q: torch.Tensor) -> torch.Tensor:
        """The sigma below which a fraction q of the (truncated) training mass lies."""
        u = self._cdf_lo + (self._cdf_hi - self._cdf_lo) * q.double()
        return (self.config.p_mean + self.config.p_std * torch.special.ndtri(u)).exp().float()

    def mass_interval(self, block: int, widened: bool = False) -> tuple[float, float]:
        """(q_lo, q_hi) of a block; widened adds `block_overlap` of mass on each side."""
        n = self.config.n_blocks
        lo, hi = 1 - (block + 1) / n, 1 - block / n
        if widened:
            lo, hi = max(0.0, lo - self.config.block_overlap), min(1.0, hi + self.config.block_overlap)
        return lo, hi

    def sigma_interval(self, block: int) -> tuple[float, float]:
        """(sigma_lo, sigma_hi) that block owns (not widened)."""
        lo, hi = self.mass_interval(block)
        return float(self.sigma_at(torch.tensor(lo))), float(self.sigma_at(torch.tensor(hi)))

    def sample(self, n: int, block: int | None, generator: torch.Generator) -> torch.Tensor:
        """n training sigmas for a block (its widened interval), or for the whole range if block is None."""
        lo, hi = (0.0, 1.0) if block is None else self.mass_interval(block, widened=True)
        q = lo + (hi - lo) * torch.rand(n, generator=generator, dtype=torch.float64)
        return self.sigma_at(q)

    def grid(self, block: int, points: int) -> torch.Tensor:
        """Sigmas at the mass midpoints of `points` equal-mass slices of a block's own interval.

        Averaging a loss over the grids of all blocks is a quadrature of its mean under the
        training noise distribution.
        """
        lo, hi = self.mass_interval(block)
        q = lo + (hi - lo) * (torch.arange(points, dtype=torch.float64) + 0.5) / points
        return self.sigma_at(q)

    def schedule(self, block: int, steps: int) -> torch.Tensor:
        """K + 1 sigmas, geometric from the top of a block's interval to its bottom: K Euler steps."""
        lo, hi = self.sigma_interval(block)
        return torch.logspace(torch.tensor(hi).log10(), torch.tensor(lo).log10(), steps + 1)


def noisy_target(codebook: torch.Tensor, target: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor):
    """z = T[y] + sigma * eps, for target bytes (N, G), sigma (N,), eps (N, G, d)."""
    return codebook[target] + sigma[:, None, None] * noise


def denoising_loss(
    denoiser: Denoiser, codebook: torch.Tensor, window: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy of the denoiser's logits against the true target bytes of each window."""
    prefix, target = window[:, : denoiser.config.prefix_len], window[:, denoiser.config.prefix_len :]
    logits = denoiser(prefix, noisy_target(codebook, target, sigma, noise), sigma)
    return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), target.reshape(-1))


def denoise_steps(
    denoiser: Denoiser, codebook: torch.Tensor, prefix: torch.Tensor, z: torch.Tensor, sigmas: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Euler steps along `sigmas` (K + 1 values): what one block runs. Returns (z, last logits).

    The clean estimate of each step is softmax(logits) @ T.
    """
    logits = None
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        logits = denoiser(prefix, z, sigma.expand(len(z)))
        clean = logits.softmax(dim=-1) @ codebook
        z = z + (sigma_next - sigma) * (z - clean) / sigma
    return z, logits


DenoiserForBlock = Callable[[int], Denoiser]
# (block, prefix, z, sigmas) -> (z after the block's steps, its last logits): where the block runs
BlockRunner = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def local_runner(denoiser_for_block: DenoiserForBlock, config: ModelConfig) -> BlockRunner:
    """Run each block in this process. `denoiser_for_block(b)` is the denoiser that owns block
    b's interval: block b itself, or the end-to-end model for every b."""
    codebook = make_codebook(config)

    def run(block: int, prefix: torch.Tensor, z: torch.Tensor, sigmas: torch.Tensor):
        return denoise_steps(denoiser_for_block(block), codebook, prefix, z, sigmas)

    return run


@torch.no_grad()
def generate_span(
    run_block: BlockRunner,
    config: ModelConfig,
    prefix: torch.Tensor,
    steps_per_block: int,
    generator: torch.Generator,
    temperature: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass through the B blocks: G bytes for each prefix (N, P). Returns (bytes, final logits).

    The noise and the byte choice come from `generator`, here, wherever the blocks run, so a
    remote pass gives the same bytes as a local one with the same weights and seed.
    temperature 0 takes the argmax.
    """
    partition = NoisePartition(config)
    shape = (len(prefix), config.gen_len, config.d_model)
    z = torch.randn(shape, generator=generator) * config.sigma_max
    for block in range(config.n_blocks):
        z, logits = run_block(block, prefix, z, partition.schedule(block, steps_per_block))
    return pick_bytes(logits, temperature, generator), logits


def pick_bytes(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Argmax at temperature 0, else one sample per position from softmax(logits / temperature)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = (logits / temperature).softmax(dim=-1)
    return torch.multinomial(probs.reshape(-1, VOCAB_SIZE), 1, generator=generator).view(probs.shape[:-1])


def input_only_ce(codebook: torch.Tensor, sigma: float, samples: int, generator: torch.Generator) -> float:
    """The cross-entropy a reader of the noisy input alone reaches at one sigma (nats per byte).

    It is the Bayes posterior over bytes given z = T[y] + sigma * eps with a uniform prior:
    the best any block can do without the prefix, so the part of its loss that needs no
    language at all.
    """
    target = torch.randint(0, VOCAB_SIZE, (samples,), generator=generator)
    z = codebook[target] + sigma * torch.randn(samples, codebook.shape[1], generator=generator)
    logits = (z @ codebook.T - 0.5 * codebook.pow(2).sum(dim=1)) / sigma**2
    return float(F.cross_entropy(logits, target))
