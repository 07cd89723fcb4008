"""Single-pass generation of the gaussian family: the Euler chain through the blocks, argmax and
temperature; and continuation in spans, for the default family (test_masked.py has its chain)."""

import pytest
import torch
from torch import nn

from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.diffusion import NoisePartition, denoise_steps, make_codebook
from swarm.model.families import generate_span, local_runner
from swarm.model.generate import continue_text, prefix_tensor
from swarm.model.steps import Sampling


@pytest.fixture
def gaussian_config(tiny_config):
    return ModelConfig(**{**tiny_config.to_dict(), "family": "gaussian"})


class Oracle(nn.Module):
    """A denoiser that always 'knows' the answer: confident logits for fixed target bytes."""

    def __init__(self, config, answer: torch.Tensor):
        super().__init__()
        self.config, self.answer, self.calls = config, answer, []
        self.weight = nn.Parameter(torch.zeros(1))  # a block computes where its weights are, in their dtype

    def forward(self, prefix, z, sigma):
        self.calls.append(float(sigma[0]))
        return torch.nn.functional.one_hot(self.answer, 256).float().expand(len(z), -1, -1) * 50.0


def test_chain_with_an_oracle_lands_on_the_answer_and_visits_every_block_interval(gaussian_config):
    answer = torch.randint(0, 256, (gaussian_config.gen_len,), generator=torch.Generator().manual_seed(3))
    oracles = [Oracle(gaussian_config, answer) for _ in range(gaussian_config.n_blocks)]
    prefix = torch.zeros(2, gaussian_config.prefix_len, dtype=torch.long)
    steps = 3
    run_block = local_runner(lambda b: oracles[b], gaussian_config)
    generated, _ = generate_span(run_block, gaussian_config, prefix, steps, torch.Generator().manual_seed(0))
    assert (generated == answer).all()
    partition = NoisePartition(gaussian_config)
    for block, oracle in enumerate(oracles):
        lo, hi = partition.sigma_interval(block)
        assert len(oracle.calls) == steps
        assert all(lo * 0.999 <= s <= hi * 1.001 for s in oracle.calls), (block, oracle.calls, lo, hi)


def test_euler_steps_move_z_to_the_clean_estimate(gaussian_config):
    codebook = make_codebook(gaussian_config)
    answer = torch.randint(0, 256, (gaussian_config.gen_len,))
    z = torch.randn(1, gaussian_config.gen_len, gaussian_config.d_model) * 10
    sigmas = torch.tensor([10.0, 5.0, 1.0, 0.0])
    prefix = torch.zeros(1, gaussian_config.prefix_len, dtype=torch.long)
    z_end, _ = denoise_steps(Oracle(gaussian_config, answer), codebook, prefix, z, sigmas)
    assert torch.allclose(z_end[0], codebook[answer], atol=1e-4)


def test_generation_is_deterministic_for_a_seed_and_samples_with_temperature(gaussian_config):
    torch.manual_seed(0)
    blocks = [build_block(gaussian_config, b).eval() for b in range(gaussian_config.n_blocks)]
    prefix = torch.randint(0, 256, (4, gaussian_config.prefix_len))
    run_block = local_runner(lambda b: blocks[b], gaussian_config)

    def run(seed: int, temperature: float) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return generate_span(run_block, gaussian_config, prefix, 2, generator, Sampling(temperature))[0]

    assert torch.equal(run(5, 0.0), run(5, 0.0))
    assert torch.equal(run(5, 1.0), run(5, 1.0))
    hot = torch.stack([run(seed, 5.0) for seed in range(3)])
    assert not (hot == hot[0]).all(), "sampling at a high temperature gave the same bytes for every seed"


def test_continue_text_writes_exactly_max_bytes_in_spans_of_g(tiny_config):
    torch.manual_seed(0)
    blocks = [build_block(tiny_config, b).eval() for b in range(tiny_config.n_blocks)]
    run_block = local_runner(lambda b: blocks[b], tiny_config)
    spans = list(continue_text(run_block, tiny_config, b"Hello", max_bytes=20, steps_per_block=1))
    assert [len(s) for s in spans] == [8, 8, 4]
    assert prefix_tensor(b"Hi", tiny_config).shape == (1, tiny_config.prefix_len)
    assert bytes(prefix_tensor(b"Hi", tiny_config)[0].tolist()).endswith(b" Hi")
