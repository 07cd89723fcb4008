"""The gaussian family: diffusion in embedding space (EDM), its partition, loss, bound and sampler.

A clean target is y0 = T[y] for a fixed codebook T (256 x d); a noisy one is
z = y0 + sigma * eps. log sigma ~ Normal(p_mean, p_std) clipped to [sigma_min, sigma_max] is
cut into B intervals of equal probability mass; block 0 owns the highest noise. Each block
trains only on its own (slightly widened) interval, and generation runs the blocks in order,
each taking K Euler steps inside its own interval.

What we found of its chain (issue 25): the probability-flow Euler step moves z towards the
clean estimate softmax(logits) @ T, and while the posterior over a byte is still spread out,
that estimate is an average of codebook rows, much shorter than any row. z therefore shrinks
below the norm every training input had (|T[y] + sigma eps|), and the lower blocks read
inputs they never saw: their output was then driven by the (then learned) position embeddings
(bytes in position order) and is confidently wrong (chain cross-entropy above a uniform guess).
`GaussianFamily.path_norms` measures it; benchmarks/quality.py reports it. The masked family
has no such gap: its path is the training marginal at every step (masked.py).
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
import torch.nn.functional as F

from swarm.model.denoiser import Denoiser, ModelConfig, over_prefix
from swarm.model.steps import BlockRunner, DenoiserForBlock, LossFn, Sampling, pick_bytes


def make_codebook(config: ModelConfig) -> torch.Tensor:
    """The fixed target codebook (vocab_size x d): random rows scaled to RMS sigma_data, from the config's seed."""
    generator = torch.Generator().manual_seed(config.codebook_seed)
    rows = torch.randn(config.vocab_size, config.d_model, generator=generator)
    return rows / rows.pow(2).mean(dim=1, keepdim=True).sqrt() * config.sigma_data


class NoisePartition:
    """Equal-mass intervals of the truncated log-normal noise distribution, one per block.

    Positions inside the distribution are given as mass fractions q in [0, 1] (q = 0 at
    sigma_min); block b owns the slice `config.block_slice(b)` of them.
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

    def sigma_interval(self, block: int) -> tuple[float, float]:
        """(sigma_lo, sigma_hi) that block owns (not widened)."""
        lo, hi = self.config.block_slice(block)
        return float(self.sigma_at(torch.tensor(lo))), float(self.sigma_at(torch.tensor(hi)))

    def sample(self, n: int, block: int | None, generator: torch.Generator) -> torch.Tensor:
        """n training sigmas for a block (its widened interval), or for the whole range if block is None."""
        lo, hi = (0.0, 1.0) if block is None else self.config.block_slice(block, widened=True)
        q = lo + (hi - lo) * torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device)
        return self.sigma_at(q)

    def grid(self, block: int, points: int) -> torch.Tensor:
        """Sigmas at the mass midpoints of `points` equal-mass slices of a block's own interval.

        Averaging a loss over the grids of all blocks is a quadrature of its mean under the
        training noise distribution.
        """
        lo, hi = self.config.block_slice(block)
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
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def denoise_steps(
    denoiser: Denoiser, codebook: torch.Tensor, prefix: torch.Tensor, z: torch.Tensor, sigmas: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Euler steps along `sigmas` (K + 1 values): what one block runs. Returns (z, last logits).

    The clean estimate of each step is softmax(logits) @ T. The steps run on the block's device,
    in its dtype; z comes back where and as it came, the logits on its device in the block's dtype.
    With the config's `prefix_cache` the prefix is encoded once for the K steps (`over_prefix`).
    """
    weight, start, logits = next(denoiser.parameters()), z, None
    codebook, prefix, z, sigmas = codebook.to(weight), prefix.to(weight.device), z.to(weight), sigmas.to(weight)
    step = over_prefix(denoiser, prefix, len(sigmas) - 1)
    for sigma, sigma_next in pairwise(sigmas):
        logits = step(z, sigma.expand(len(z)))
        clean = logits.softmax(dim=-1) @ codebook
        z = z + (sigma_next - sigma) * (z - clean) / sigma
    return z.to(start), logits.to(start.device)


def input_only_ce(codebook: torch.Tensor, sigma: float, samples: int, generator: torch.Generator) -> float:
    """The cross-entropy a reader of the noisy input alone reaches at one sigma (nats per byte).

    It is the Bayes posterior over bytes given z = T[y] + sigma * eps with a uniform prior:
    the best any block can do without the prefix, so the part of its loss that needs no
    language at all.
    """
    target = torch.randint(0, len(codebook), (samples,), generator=generator)
    z = codebook[target] + sigma * torch.randn(samples, codebook.shape[1], generator=generator)
    logits = (z @ codebook.T - 0.5 * codebook.pow(2).sum(dim=1)) / sigma**2
    return float(F.cross_entropy(logits, target))


def block_draws(config: ModelConfig, count: int, seed: int) -> torch.Tensor:
    """Fixed noise eps (count, G, d) for evaluating every model on the same draws."""
    return torch.randn(count, config.gen_len, config.d_model, generator=torch.Generator().manual_seed(seed))


class GaussianFamily:
    """The gaussian family behind the interface of swarm/model/families.py."""

    name = "gaussian"

    def __init__(self, config: ModelConfig):
        self.config, self.partition, self.codebook = config, NoisePartition(config), make_codebook(config)

    def training_loss(self, denoiser: Denoiser, block: int | None, stratified: bool = False) -> LossFn:
        """The loss of one block on its widened sigma slice (of the end-to-end model on all of it);
        `stratified` is the masked family's (its sigmas are drawn independently, as measured)."""
        device = next(denoiser.parameters()).device
        codebook, shape = self.codebook.to(device), (self.config.gen_len, self.config.d_model)

        def loss(window: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
            sigma = self.partition.sample(len(window), block, generator)
            noise = torch.randn(len(window), *shape, generator=generator, device=generator.device)
            return denoising_loss(denoiser, codebook, window, sigma.to(device), noise.to(device))

        return loss

    @torch.no_grad()
    def block_loss(self, denoiser: Denoiser, block: int, windows: torch.Tensor, points: int, seed: int) -> float:
        """Cross-entropy of the block's logits (nats per byte), averaged over its grid of sigmas, fixed draws."""
        device = next(denoiser.parameters()).device  # the draws are made on the CPU: the same on every device
        codebook, windows = self.codebook.to(device), windows.to(device)
        noise, losses = block_draws(self.config, len(windows), seed).to(device), []
        for sigma in self.partition.grid(block, points).to(device):
            sigmas = sigma.expand(len(windows))
            losses.append(float(denoising_loss(denoiser, codebook, windows, sigmas, noise)))
        return sum(losses) / len(losses)

    @torch.no_grad()
    def block_elbo(self, denoiser: Denoiser, block: int, windows: torch.Tensor, points: int, seed: int) -> float:
        """Block `block`'s share of the variational bound on -log p(target), in nats per byte.

        The continuous-time bound of a variance-exploding diffusion (Kingma et al., VDM) is a
        prior term at sigma_max, a reconstruction term at sigma_min and, between them,
        integral of E |T[y] - x_hat(z, sigma)|^2 / sigma^2 d ln sigma, with x_hat the clean
        estimate softmax(logits) @ T. Each block integrates over its own sigma slice (a
        midpoint rule in ln sigma); the block at sigma_max adds the prior term (generation
        starts from N(0, sigma_max^2)), the one at sigma_min the reconstruction term with the
        exact context-free decoder p(y | z).
        """
        device = next(denoiser.parameters()).device  # the draws are made on the CPU: the same on every device
        config, codebook, windows = self.config, self.codebook.to(device), windows.to(device)
        lo, hi = self.partition.sigma_interval(block)
        prefix, target = windows[:, : config.prefix_len], windows[:, config.prefix_len :]
        noise, clean = block_draws(config, len(windows), seed).to(device), codebook[target]
        width = (math.log(hi) - math.log(lo)) / points
        total = 0.0
        for k in range(points):
            sigma = torch.tensor(math.exp(math.log(lo) + (k + 0.5) * width), device=device)
            logits = denoiser(prefix, clean + sigma * noise, sigma.expand(len(windows)))
            error = (clean - logits.softmax(dim=-1) @ codebook).pow(2).sum(dim=-1).mean()
            total += float(error) / float(sigma) ** 2 * width
        if block == 0:
            total += float(clean.pow(2).sum(dim=-1).mean()) / (2 * config.sigma_max**2)
        if block == config.n_blocks - 1:
            z = clean + config.sigma_min * noise
            decoder = (z @ codebook.T - 0.5 * codebook.pow(2).sum(dim=1)) / config.sigma_min**2
            total += float(F.cross_entropy(decoder.reshape(-1, decoder.shape[-1]), target.reshape(-1)))
        return total

    def run_steps(self, denoiser: Denoiser, prefix: torch.Tensor, z: torch.Tensor, sigmas: torch.Tensor,
                  seed: int, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """A block's Euler steps: deterministic, so the seed and the sampling settings go unused."""
        return denoise_steps(denoiser, self.codebook, prefix, z, sigmas)

    def schedule(self, block: int, steps: int) -> torch.Tensor:
        return self.partition.schedule(block, steps)

    @torch.no_grad()
    def generate_span(self, run_block: BlockRunner, prefix: torch.Tensor, steps_per_block: int,
                      generator: torch.Generator,
                      sampling: Sampling = Sampling()) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """One pass through the B blocks: G bytes for each prefix (N, P). Returns (bytes, final logits).

        The start noise and the byte choice come from `generator`, here, wherever the blocks run.
        """
        config = self.config
        z = torch.randn((len(prefix), config.gen_len, config.d_model), generator=generator) * config.sigma_max
        for block in range(config.n_blocks):
            z, logits = run_block(block, prefix, z, self.schedule(block, steps_per_block), 0, sampling)
        return pick_bytes(logits, sampling.temperature, generator), logits

    @torch.no_grad()
    def path_norms(self, denoiser_for_block: DenoiserForBlock, prefix: torch.Tensor, steps_per_block: int,
                   generator: torch.Generator) -> list[float]:  # fmt: skip
        """Where the chain hands each block its span, against where training put it: for each block,
        the mean norm of z per byte at its first sigma, over the norm a training input has there,
        sqrt(d (sigma_data^2 + sigma^2)). 1.0 is on the training path; well below 1, the block
        reads inputs it never saw (the module docstring)."""
        config = self.config
        z = torch.randn((len(prefix), config.gen_len, config.d_model), generator=generator) * config.sigma_max
        ratios = []
        for block in range(config.n_blocks):
            sigmas = self.schedule(block, steps_per_block)
            trained = math.sqrt(config.d_model * (config.sigma_data**2 + float(sigmas[0]) ** 2))
            ratios.append(float(z.norm(dim=-1).mean()) / trained)
            z, _ = denoise_steps(denoiser_for_block(block), self.codebook, prefix, z, sigmas)
        return ratios

    def check_state(self, z: torch.Tensor, n: int) -> None:
        """ValueError unless z is a span state a peer may be asked to denoise."""
        shape = (n, self.config.gen_len, self.config.d_model)
        if z.dtype != torch.float32 or z.shape != shape:
            raise ValueError(f"z must be float32 of shape {shape}")
        if not torch.isfinite(z).all() or z.abs().max() > MAX_ABS_Z:
            raise ValueError("z must be finite and of sane magnitude")

    def check_answer(self, z: torch.Tensor, sigmas: torch.Tensor, answer: torch.Tensor) -> None:
        """Nothing to check beyond `check_state`: every step moves every coordinate of z."""

    def check_schedule(self, sigmas: torch.Tensor) -> None:
        if not torch.isfinite(sigmas).all() or (sigmas <= 0).any() or (sigmas[1:] >= sigmas[:-1]).any():
            raise ValueError("sigmas must be finite, positive and decreasing")


MAX_ABS_Z = 1e4  # the largest |z| a peer accepts in a request
