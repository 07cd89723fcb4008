"""The figures of quality on validation windows (lower is better, except the share of real words).

Every model is scored on the same windows and, within a family, the same noise draws:
- bits_per_byte: the model's likelihood of the true continuation. For the masked family, the
  exact likelihood of writing it with the leftmost sampler at temperature 1 and generation's
  default steps per block (`MaskedFamily.leftmost_nll`), each unit's share from the block that
  writes it; for the gaussian family, which has no exact one, its variational bound (ELBO); for
  the autoregressive baseline, its teacher-forced cross-entropy. All are of the same G target
  units after the same P-unit prefix, and all are per byte of the text those units stand for
  (`units_per_byte`), so models of any units compare, and with a compressor's output;
- elbo_bits_per_byte (masked family): its variational bound over the whole noise range, each
  noise level evaluated by the block that owns it: the figure the masked-diffusion papers report,
  and what training lowers. It averages over every reveal order, so it is above the leftmost
  order's exact figure when left to right is the easier order (it is, on text);
- denoise_ce: the family's cross-entropy on a fixed grid of noise levels of each block (the
  spot check's figure), overall and per block, in nats per unit;
- chain_ce: cross-entropy (nats per unit), against the true next G units, of the logits
  single-pass generation drew each unit from;
- gen_nll: the autoregressive judge's negative log-likelihood (nats per unit) of the generated
  units, beside the same figure for the true continuation (true_nll);
- prompt_influence: bits_per_byte of the true continuations after their own prompts over the same
  after another article's prompts (`prompt_influence`): 1.0 for a model that ignores its prompt,
  lower the more the prompt steers it;
- real_words: the share of the whole words generated that occur in the training text
  (words.py), beside the same share of the true continuation; distinct_words: the share of
  each span's words that differ (1.0 for no repeats); word_entropy: the entropy in bits of the
  written words pooled over all spans (repeating common words lowers it); each beside the true
  continuation's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from swarm.model.autoregressive import ByteTransformer, continuation_nll, generate_bytes
from swarm.model.denoiser import ModelConfig
from swarm.model.families import family_of, generate_span, local_runner
from swarm.model.generate import STEPS_PER_BLOCK
from swarm.model.steps import DenoiserForBlock, Sampling
from swarm.model.words import real_word_share

GRID_POINTS_PER_BLOCK = 3  # noise levels per block of denoise_ce (the spot check's figure)
ELBO_POINTS_PER_BLOCK = 8  # noise levels per block of the bound
NOISE_SEED = 4321
BATCH = 64


def _batches(windows: torch.Tensor):
    return torch.split(windows, BATCH)


def _mean_over_batches(figure, windows: torch.Tensor) -> float:
    """A per-window mean figure over all windows, computed a batch at a time (bounded memory);
    `figure(batch, seed)` draws its noise from `seed`, a different one for each batch."""
    return sum(figure(batch, NOISE_SEED + i) * len(batch) for i, batch in enumerate(_batches(windows))) / len(windows)


@torch.no_grad()
def block_denoise_ce(denoiser: nn.Module, config: ModelConfig, block: int, windows: torch.Tensor) -> float:
    """One block's cross-entropy (nats per byte), averaged over its grid of noise levels, fixed draws."""
    family, denoiser = family_of(config), denoiser.eval()
    return _mean_over_batches(
        lambda batch, seed: family.block_loss(denoiser, block, batch, GRID_POINTS_PER_BLOCK, seed), windows
    )


@torch.no_grad()
def denoise_ce(denoiser_for_block: DenoiserForBlock, config: ModelConfig, windows: torch.Tensor) -> dict:
    """{'overall': mean over all grid noise levels, 'per_block': [mean over each block's grid]}."""
    per_block = [block_denoise_ce(denoiser_for_block(b), config, b, windows) for b in range(config.n_blocks)]
    return {"overall": sum(per_block) / len(per_block), "per_block": per_block}


def units_per_byte(windows: torch.Tensor, config: ModelConfig) -> float:
    """How many of the model's units the windows' targets hold per byte of text they stand for
    (1 for raw bytes): a figure per unit times this is a figure per byte."""
    target = windows[:, config.prefix_len :]
    return target.numel() / float(config.units().byte_lengths[target].sum())


@torch.no_grad()
def block_elbo_bits(denoiser: nn.Module, config: ModelConfig, block: int, windows: torch.Tensor) -> float:
    """Block `block`'s share of the bound on -log2 p(target), in bits per byte of text, fixed draws."""
    family, denoiser = family_of(config), denoiser.eval()
    nats = _mean_over_batches(
        lambda batch, seed: family.block_elbo(denoiser, block, batch, ELBO_POINTS_PER_BLOCK, seed), windows
    )
    return nats * units_per_byte(windows, config) / math.log(2)


@torch.no_grad()
def elbo_bits_per_byte(denoiser_for_block: DenoiserForBlock, config: ModelConfig, windows: torch.Tensor) -> dict:
    """{'overall': the bound on -log2 p(target) per byte, 'per_block': each block's share of it}."""
    per_block = [block_elbo_bits(denoiser_for_block(b), config, b, windows) for b in range(config.n_blocks)]
    return {"overall": sum(per_block), "per_block": per_block}


@torch.no_grad()
def block_bits(denoiser: nn.Module, config: ModelConfig, block: int, windows: torch.Tensor) -> float:
    """Block `block`'s share of the model's bits per byte (`bits_per_byte`), fixed draws."""
    if config.family != "masked":
        return block_elbo_bits(denoiser, config, block, windows)
    family, denoiser = family_of(config), denoiser.eval()
    def per_unit(batch: torch.Tensor, _seed: int) -> float:
        return float(family.leftmost_nll(denoiser, block, batch, STEPS_PER_BLOCK).mean()) / config.gen_len

    nats = _mean_over_batches(per_unit, windows)
    return nats * units_per_byte(windows, config) / math.log(2)


@torch.no_grad()
def bits_per_byte(denoiser_for_block: DenoiserForBlock, config: ModelConfig, windows: torch.Tensor) -> dict:
    """{'overall': -log2 p(target) per byte (see the module docstring), 'per_block': each block's share}."""
    per_block = [block_bits(denoiser_for_block(b), config, b, windows) for b in range(config.n_blocks)]
    return {"overall": sum(per_block), "per_block": per_block}


def far_partners(starts: torch.Tensor) -> torch.Tensor:
    """For each window, by where it starts in its split's stream, the index of the window whose
    prompt `prompt_influence` puts before its continuation: the one half the windows away in stream
    order, so that the two start about half the stream apart. Windows carry no article id (a split's
    documents are joined into one stream, data.py); half the stream is far beyond any one article
    (the built-in validation split: about 1000 lead sections, the longest 1.5 kB, in 0.5 MB), so the
    prompt is another article's."""
    order = torch.argsort(starts)
    partners = torch.empty_like(order)
    partners[order] = order.roll(-(len(order) // 2))
    return partners


def with_prompts_of(windows: torch.Tensor, partners: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """The windows, each with its own continuation after the prompt (prefix) of window `partners[i]`."""
    return torch.cat([windows[partners, :prefix_len], windows[:, prefix_len:]], dim=1)


def prompt_influence(
    bits: Callable[[torch.Tensor], float], windows: torch.Tensor, partners: torch.Tensor, prefix_len: int
) -> dict:
    """How much a model's prompt steers it: `bits(windows)` (a model's bits per byte of the windows'
    continuations after their prefixes) with each window's own prompt, over the same with the
    prompt of window `partners[i]` (`far_partners`: another article's). The same continuations are
    scored both times, so the ratio is one of totals and reads alone: 1.0 for a model that ignores
    its prompt, lower the more the prompt tells it what comes next (the bits per byte alone mixes
    that with how well it knows the language)."""
    own, other = bits(windows), bits(with_prompts_of(windows, partners, prefix_len))
    return {"own_prompt_bits_per_byte": own, "other_prompt_bits_per_byte": other, "prompt_influence": own / other}


@torch.no_grad()
def generate_for_windows(
    denoiser_for_block: DenoiserForBlock,
    config: ModelConfig,
    windows: torch.Tensor,
    steps_per_block: int,
    sampling: Sampling = Sampling(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-pass generation (fixed draws; argmax at the default temperature) after each window's
    prefix: (units, logits)."""
    generator, run_block = torch.Generator().manual_seed(NOISE_SEED), local_runner(denoiser_for_block, config)
    outputs = [
        generate_span(run_block, config, w[:, : config.prefix_len], steps_per_block, generator, sampling)
        for w in _batches(windows)
    ]
    return torch.cat([o[0] for o in outputs]), torch.cat([o[1] for o in outputs])


def chain_ce(logits: torch.Tensor, windows: torch.Tensor, config: ModelConfig) -> float:
    target = windows[:, config.prefix_len :]
    return float(F.cross_entropy(logits.reshape(-1, config.vocab_size), target.reshape(-1)))


@torch.no_grad()
def judge_nll(judge: ByteTransformer, windows: torch.Tensor, continuation: torch.Tensor, config: ModelConfig) -> float:
    """Mean NLL per unit that the autoregressive judge gives `continuation` after each prefix."""
    judge.eval()
    prefix = windows[:, : config.prefix_len]
    nll = [continuation_nll(judge, p, c) for p, c in zip(_batches(prefix), _batches(continuation))]
    return float(torch.cat(nll).mean())


def word_figures(windows: torch.Tensor, continuation: torch.Tensor, config: ModelConfig, known: frozenset[str]) -> dict:
    """The sample figures of the written continuation (see the module docstring) beside the true one's."""
    units = config.units()
    prefixes = [units.decode(row.tolist()) for row in windows[:, : config.prefix_len]]
    written = real_word_share(prefixes, [units.decode(row.tolist()) for row in continuation], known)
    true = real_word_share(prefixes, [units.decode(row.tolist()) for row in windows[:, config.prefix_len :]], known)
    return {"real_words": written["share"], "true_real_words": true["share"], "words_counted": written["words"],
            "distinct_words": written["distinct"], "true_distinct_words": true["distinct"],
            "word_entropy": written["entropy"], "true_word_entropy": true["entropy"]}


def evaluate_denoiser(
    denoiser_for_block: DenoiserForBlock,
    config: ModelConfig,
    windows: torch.Tensor,
    steps_per_block: int = 1,
    judge: ByteTransformer | None = None,
    known_words: frozenset[str] | None = None,
    sampling: Sampling = Sampling(),
) -> dict:
    """All figures of a block model or the end-to-end model; gen_nll only with a judge, real_words
    only with the training text's words."""
    generated, logits = generate_for_windows(denoiser_for_block, config, windows, steps_per_block, sampling)
    figures = {
        "family": config.family,
        "reveal": sampling.reveal,
        "bits_per_byte": bits_per_byte(denoiser_for_block, config, windows),
        "denoise_ce": denoise_ce(denoiser_for_block, config, windows),
        "chain_ce": chain_ce(logits, windows, config),
    }
    if config.family == "masked":
        figures["elbo_bits_per_byte"] = elbo_bits_per_byte(denoiser_for_block, config, windows)
    if judge is not None:
        figures["gen_nll"] = judge_nll(judge, windows, generated, config)
        figures["true_nll"] = judge_nll(judge, windows, windows[:, config.prefix_len :], config)
    if known_words is not None:
        figures.update(word_figures(windows, generated, config, known_words))
    return figures


def evaluate_autoregressive(
    model: ByteTransformer,
    config: ModelConfig,
    windows: torch.Tensor,
    known_words: frozenset[str] | None = None,
    temperature: float = 0.0,
) -> dict:
    """The autoregressive model's teacher-forced cross-entropy (nats per unit, and bits per byte)
    of the same G units, and, with the training text's words, the sample figures of its own
    continuations at `temperature` (0: the argmax)."""
    ar_ce = judge_nll(model, windows, windows[:, config.prefix_len :], config)
    figures = {"ar_ce": ar_ce, "bits_per_byte": {"overall": ar_ce * units_per_byte(windows, config) / math.log(2)}}
    if known_words is not None:
        model.eval()
        generator = torch.Generator().manual_seed(NOISE_SEED)
        written = torch.cat([generate_bytes(model, w[:, : config.prefix_len], config.gen_len, generator, temperature)
                             for w in _batches(windows)])  # fmt: skip
        figures.update(word_figures(windows, written, config, known_words))
    return figures
