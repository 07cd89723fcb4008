"""prompt_influence (swarm/model/evaluate.py): 1.0 for a model that cannot see its prompt, far below
1.0 for one whose prompt decides the continuation, on the blocks' likelihood and the autoregressive one's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swarm.model.autoregressive import ByteTransformer
from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.evaluate import bits_per_byte, evaluate_autoregressive, far_partners, prompt_influence

SURE = 20.0  # a logit this far above the rest: the unit is all but certain


class PromptBlindBlock(nn.Module):
    """A block with random weights that is shown zeros where its prompt was: its logits depend on the
    revealed units and the noise level, never on the prompt."""

    def __init__(self, config: ModelConfig, block: int):
        super().__init__()
        self.inner = build_block(config, block)
        for parameter in self.inner.parameters():
            nn.init.normal_(parameter, std=0.3)  # fresh blocks start deaf to the noise level

    def forward(self, prefix, ids, t):
        return self.inner(torch.zeros_like(prefix), ids, t)


class CopyingBlock(nn.Module):
    """A block sure that the span repeats the prompt's first units."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config, self.weight = config, nn.Parameter(torch.zeros(1))  # a block computes where its weights are

    def forward(self, prefix, ids, t):
        return F.one_hot(prefix[:, : self.config.gen_len], self.config.vocab_size).float() * SURE


class PromptBlindAutoregressive(ByteTransformer):
    """A causal model with random weights that is shown zeros where the prompt was."""

    def forward(self, tokens):
        return super().forward(torch.cat([torch.zeros_like(tokens[:, : self.config.prefix_len]),
                                          tokens[:, self.config.prefix_len :]], dim=1))  # fmt: skip


class CopyingAutoregressive(ByteTransformer):
    """A causal model sure that each unit after the prompt repeats the one prefix_len units back."""

    def forward(self, tokens):
        back = self.config.prefix_len - 1  # logits at j are for unit j + 1
        logits = torch.zeros(*tokens.shape, self.config.vocab_size)
        logits[:, back:] = F.one_hot(tokens[:, : tokens.shape[1] - back], self.config.vocab_size).float() * SURE
        return logits


def blocks_bits(blocks: list[nn.Module], config: ModelConfig):
    return lambda windows: bits_per_byte(lambda b: blocks[b], config, windows)["overall"]


def autoregressive_bits(model: ByteTransformer, config: ModelConfig):
    return lambda windows: evaluate_autoregressive(model, config, windows)["bits_per_byte"]["overall"]


@pytest.fixture
def config(tiny_config) -> ModelConfig:
    return ModelConfig(**{**tiny_config.to_dict(), "family": "masked"})


@pytest.fixture
def copy_windows(config) -> torch.Tensor:
    """Random prompts, each followed by its own first gen_len units: the prompt decides the span."""
    prompts = torch.randint(0, 256, (32, config.prefix_len), generator=torch.Generator().manual_seed(3))
    return torch.cat([prompts, prompts[:, : config.gen_len]], dim=1)


def model_bits(kind: str, role: str, config: ModelConfig):
    """bits(windows) of a prompt-blind or a copying model of the blocks or the autoregressive kind."""
    torch.manual_seed(0)
    if kind == "blocks":
        make = (lambda b: PromptBlindBlock(config, b)) if role == "blind" else (lambda b: CopyingBlock(config))
        return blocks_bits([make(b).eval() for b in range(config.n_blocks)], config)
    model = (PromptBlindAutoregressive if role == "blind" else CopyingAutoregressive)(config, n_layers=1)
    return autoregressive_bits(model.eval(), config)


@pytest.mark.parametrize("kind", ["blocks", "autoregressive"])
def test_a_model_that_cannot_see_its_prompt_scores_one(kind, config, copy_windows):
    partners = far_partners(torch.arange(len(copy_windows)))
    figures = prompt_influence(model_bits(kind, "blind", config), copy_windows, partners, config.prefix_len)
    assert figures["own_prompt_bits_per_byte"] > 1.0  # it scores something: the ratio is not 0/0 or a constant's
    assert figures["prompt_influence"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("kind", ["blocks", "autoregressive"])
def test_a_model_whose_prompt_decides_the_span_scores_far_below_one(kind, config, copy_windows):
    """After another window's prompt the copied span is wrong: the true one costs about SURE nats a unit."""
    partners = far_partners(torch.arange(len(copy_windows)))
    figures = prompt_influence(model_bits(kind, "copy", config), copy_windows, partners, config.prefix_len)
    assert figures["other_prompt_bits_per_byte"] > 20.0
    assert figures["prompt_influence"] < 0.01


def test_far_partners_pair_every_window_with_the_one_half_the_stream_away(tiny_windows):
    starts = torch.randperm(64, generator=torch.Generator().manual_seed(1)) * 10
    partners = far_partners(starts)
    assert sorted(partners.tolist()) == list(range(64))  # every prompt lends itself once
    assert (starts - starts[partners]).abs().tolist() == [320] * 64  # half of 64 windows 10 units apart
    fixed = tiny_windows.fixed_starts(16)
    assert torch.equal(tiny_windows.at(fixed), tiny_windows.fixed(16))  # the starts of the evaluated windows
