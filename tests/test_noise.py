"""The noise partition: equal mass per block, ordering, and a default range that does not leak."""

import math

import pytest
import torch

from swarm.model.denoiser import ModelConfig
from swarm.model.diffusion import NoisePartition, input_only_ce, make_codebook


def truncated_mass(config: ModelConfig, lo: float, hi: float) -> float:
    normal = torch.distributions.Normal(config.p_mean, config.p_std)
    cdf = lambda s: normal.cdf(torch.tensor(math.log(s))).item()  # noqa: E731
    return (cdf(hi) - cdf(lo)) / (cdf(config.sigma_max) - cdf(config.sigma_min))


@pytest.mark.parametrize("n_blocks", [1, 2, 4, 8])
def test_each_block_owns_equal_probability_mass(n_blocks):
    config = ModelConfig(n_layers=8, n_blocks=n_blocks)
    partition = NoisePartition(config)
    intervals = [partition.sigma_interval(b) for b in range(n_blocks)]
    for lo, hi in intervals:
        assert truncated_mass(config, lo, hi) == pytest.approx(1 / n_blocks, abs=1e-5)
    assert intervals[0][1] == pytest.approx(config.sigma_max, rel=1e-5)
    assert intervals[-1][0] == pytest.approx(config.sigma_min, rel=1e-5)
    for upper, lower in zip(intervals, intervals[1:]):  # block 0 owns the highest noise, contiguous
        assert upper[0] == pytest.approx(lower[1], rel=1e-6)


def test_training_sigmas_follow_the_partition():
    config = ModelConfig()
    partition = NoisePartition(config)
    sigmas = partition.sample(40_000, None, torch.Generator().manual_seed(0))
    for block in range(config.n_blocks):
        lo, hi = partition.sigma_interval(block)
        share = ((sigmas >= lo) & (sigmas < hi)).float().mean().item()
        assert share == pytest.approx(1 / config.n_blocks, abs=0.01)
        own = partition.sample(2_000, block, torch.Generator().manual_seed(block))
        if block < config.n_blocks - 1:  # widened below, except at sigma_min
            assert own.min() < lo
        if block > 0:  # widened above, except at sigma_max
            assert own.max() > hi
        assert own.min() >= config.sigma_min * 0.999 and own.max() <= config.sigma_max * 1.001
        grid = partition.grid(block, 3)
        assert ((grid > lo) & (grid < hi)).all()


def input_only_ce_under_training(config: ModelConfig, block: int | None, points: int = 16) -> float:
    """What a block reaches by reading its noisy input alone, averaged over its sigmas."""
    partition, codebook = NoisePartition(config), make_codebook(config)
    blocks = range(config.n_blocks) if block is None else [block]
    generator = torch.Generator().manual_seed(0)
    values = [input_only_ce(codebook, float(s), 2000, generator) for b in blocks for s in partition.grid(b, points)]
    return sum(values) / len(values)


LEAKING = {"sigma_min": 0.3, "sigma_max": 10.0, "p_mean": math.log(2.0)}
BYTE_UNITS = {"vocab_size": 256, "tokenizer": None, "tie_embeddings": False}  # the units this range was measured on


def test_default_range_does_not_leak_the_answer_through_the_input():
    """Reading the noisy input alone (the Bayes posterior, the best any reader can do) must
    leave most of the loss to be earned from the prefix, and the chain's starting noise must
    carry no answer. An obviously leaking range gives the answer away on both counts."""
    default, leaking = ModelConfig(**BYTE_UNITS), ModelConfig(**BYTE_UNITS, **LEAKING)
    ln256 = math.log(256)

    assert input_only_ce_under_training(default, None) > 2.5
    assert input_only_ce_under_training(leaking, None) < 1.7

    lowest = default.n_blocks - 1
    assert input_only_ce_under_training(default, lowest) > 0.2  # the lowest block still has to learn
    assert input_only_ce_under_training(leaking, lowest) < 0.01  # here it reads the answer off its input

    generator = torch.Generator().manual_seed(1)
    assert input_only_ce(make_codebook(default), default.sigma_max, 4000, generator) > 0.98 * ln256
    assert input_only_ce(make_codebook(leaking), leaking.sigma_max, 4000, generator) < 0.96 * ln256


def test_the_default_range_does_not_leak_with_the_built_in_tokenizers_units_either():
    """The same bounds, as shares of a uniform guess, for a codebook of the built-in tokenizer's 8192
    units: more rows in the same width make the input say less, never more."""
    default = ModelConfig(family="gaussian", tie_embeddings=False)
    uniform = math.log(default.vocab_size)
    assert default.vocab_size > 256
    assert input_only_ce_under_training(default, None) > 2.5 / math.log(256) * uniform
    assert input_only_ce_under_training(default, default.n_blocks - 1) > 0.2
    generator = torch.Generator().manual_seed(1)
    assert input_only_ce(make_codebook(default), default.sigma_max, 4000, generator) > 0.98 * uniform
