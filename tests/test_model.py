import pytest
import torch
from torch import nn

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig, build_block, build_end_to_end, count_parameters
from swarm.model.families import family_of
from swarm.model.steps import REVEAL_ORDERS, Sampling


def test_config_hash_is_stable_and_tracks_every_field(tiny_config):
    same = ModelConfig.from_dict(tiny_config.to_dict())
    assert same.hash() == tiny_config.hash()
    assert ModelConfig.from_dict({**tiny_config.to_dict(), "codebook_seed": 1}).hash() != tiny_config.hash()


def test_default_noise_range_follows_codebook_snr():
    config = ModelConfig()
    assert config.sigma_min == pytest.approx(1.0)
    assert config.sigma_max == pytest.approx(20.0)
    assert config.p_mean == pytest.approx(torch.tensor(4.0).log().item())


@pytest.mark.parametrize(
    "bad", [{"n_layers": 3, "n_blocks": 2}, {"d_model": 30, "n_heads": 4}, {"sigma_min": 5.0, "sigma_max": 2.0}]
)
def test_invalid_config_is_a_user_error(bad):
    with pytest.raises(SwarmError):
        ModelConfig(**bad)


def test_unknown_config_field_is_a_user_error(tiny_config):
    with pytest.raises(SwarmError, match="unknown fields"):
        ModelConfig.from_dict({**tiny_config.to_dict(), "n_experts": 8})


def test_block_is_one_over_b_of_the_layers(tiny_config):
    block, whole = build_block(tiny_config, 0), build_end_to_end(tiny_config)
    assert len(block.layers) == tiny_config.n_layers // tiny_config.n_blocks
    assert len(whole.layers) == tiny_config.n_layers
    assert count_parameters(block) < count_parameters(whole)


@pytest.mark.parametrize("family", ["masked", "gaussian"])
def test_denoiser_gives_logits_for_every_target_position(tiny_config, family):
    config = ModelConfig(**{**tiny_config.to_dict(), "family": family})
    block = build_block(config, 1)
    prefix = torch.randint(0, 256, (3, config.prefix_len))
    if family == "gaussian":
        target, level = torch.randn(3, config.gen_len, config.d_model), torch.full((3,), 2.0)
    else:
        target, level = torch.randint(0, config.mask_id + 1, (3, config.gen_len)), torch.full((3,), 0.3)
    logits = block(prefix, target, level)
    assert logits.shape == (3, config.gen_len, 256)
    assert torch.isfinite(logits).all()


def test_block_index_out_of_range_is_a_user_error(tiny_config):
    with pytest.raises(SwarmError, match="out of range"):
        build_block(tiny_config, tiny_config.n_blocks)


# --- the prefix cache (ModelConfig.prefix_cache) ---------------------------------------------------


def variant(config: ModelConfig, **changes) -> ModelConfig:
    return ModelConfig(**{**config.to_dict(), **changes})


def awake_block(config: ModelConfig) -> nn.Module:
    """Block 0 with its adaptive norms away from their zero start, so that the noise level
    reaches every row they modulate (a new block's modulation is zero, and would hide it)."""
    torch.manual_seed(0)
    block = build_block(config, 0).eval()
    for layer in block.layers:
        nn.init.normal_(layer.modulation.weight, std=0.2)
    return block


def family_inputs(config: ModelConfig, n: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prefix, target, level) of the config's family."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 256, (n, config.prefix_len), generator=generator)
    if config.family == "gaussian":
        return prefix, torch.randn(n, config.gen_len, config.d_model, generator=generator), torch.full((n,), 2.0)
    return prefix, torch.randint(0, config.mask_id + 1, (n, config.gen_len), generator=generator), torch.full((n,), 0.4)


def prefix_rows(
    block: nn.Module, prefix: torch.Tensor, target: torch.Tensor, level: torch.Tensor
) -> list[torch.Tensor]:
    """The prefix rows' hidden states after every layer of the full forward."""
    seen = []
    hooks = [layer.register_forward_hook(lambda _, __, out: seen.append(out[:, : block.config.prefix_len]))
             for layer in block.layers]  # fmt: skip
    try:
        block(prefix, target, level)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


BYTE_MODEL = {"prefix_len": 64, "gen_len": 32, "vocab_size": 256, "tokenizer": None, "tie_embeddings": False}


def test_a_config_without_the_later_fields_keeps_the_hash_it_had_before_them():
    """Checkpoints and swarm records written before `prefix_cache` and the units fields existed (the
    byte model that was the default until tokens) stay valid; turning any of them on is another model."""
    before = ModelConfig(**BYTE_MODEL)
    assert before.hash() == "abde5cb9e403f392867f5b82e0688e941cd147170c2964211ac4d6579fd6e3e8"
    assert ModelConfig(**BYTE_MODEL, prefix_cache=True).hash() != before.hash()
    assert ModelConfig(**{**BYTE_MODEL, "tie_embeddings": True}).hash() != before.hash()


@pytest.mark.parametrize("family", ["masked", "gaussian"])
def test_the_cached_prefix_gives_the_full_forwards_logits(tiny_config, family):
    block = awake_block(variant(tiny_config, family=family, prefix_cache=True))
    prefix, target, level = family_inputs(block.config)
    with torch.no_grad():
        full, cached = block(prefix, target, level), block(prefix, target, level, block.encode_prefix(prefix))
    assert torch.allclose(cached, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["masked", "gaussian"])
def test_with_the_prefix_cache_the_prefix_rows_read_neither_the_target_nor_the_level(tiny_config, family):
    """On: the prefix rows' hidden states at every layer are the same whatever the target and the
    noise level. Off (today's model, same weights): both reach them."""
    on = awake_block(variant(tiny_config, family=family, prefix_cache=True))
    off = variant(tiny_config, family=family)
    prefix, target, level = family_inputs(on.config)
    other_target, other_level = family_inputs(on.config, seed=1)[1], level / 2
    with torch.no_grad():
        for block in (on, awake_block(off)):
            rows = prefix_rows(block, prefix, target, level)
            for changed in (
                prefix_rows(block, prefix, other_target, level),
                prefix_rows(block, prefix, target, other_level),
            ):
                same = all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(rows, changed))
                assert same == block.config.prefix_cache


def test_only_a_config_with_the_prefix_cache_encodes_a_prefix(tiny_config):
    block = build_block(tiny_config, 0)
    with pytest.raises(ValueError, match="prefix_cache"):
        block.encode_prefix(torch.zeros(1, tiny_config.prefix_len, dtype=torch.long))


class FullForward(nn.Module):
    """A block behind a config without `prefix_cache`: its steps run its full forward every time."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block, self.config = block, variant(block.config, prefix_cache=False)

    def forward(self, prefix, target, level):
        return self.block(prefix, target, level)


def start_state(config: ModelConfig) -> torch.Tensor:
    """What a pass hands block 0: all bytes hidden, or the gaussian family's noisy embeddings."""
    if config.family == "masked":
        return torch.full((3, config.gen_len), config.mask_id)
    return torch.randn(3, config.gen_len, config.d_model, generator=torch.Generator().manual_seed(2)) * 10


@pytest.mark.parametrize("family, reveal", [("masked", r) for r in REVEAL_ORDERS] + [("gaussian", "confident")])
def test_a_blocks_steps_over_the_cached_prefix_write_what_the_full_forward_writes(tiny_config, family, reveal):
    """One request's K steps encode the prefix once and run the target rows alone (the layers see
    G rows), and write the same bytes (the masked family) or state (the gaussian) for a seed."""
    config = variant(tiny_config, family=family, prefix_cache=True)
    block, steps, prefix, start = awake_block(config), family_of(config), family_inputs(config)[0], start_state(config)
    rows = []
    block.layers[0].register_forward_hook(lambda _, inputs, __: rows.append(inputs[0].shape[1]))
    schedule, sampling = steps.schedule(0, 4), Sampling(temperature=1.0, reveal=reveal)
    cached, cached_logits = steps.run_steps(block, prefix, start, schedule, 7, sampling)
    assert rows == [config.gen_len] * 4
    full, full_logits = steps.run_steps(FullForward(block), prefix, start, schedule, 7, sampling)
    assert rows[4:] == [config.seq_len] * 4
    steps.run_steps(block, prefix, start, schedule[-2:], 7, sampling)  # one step: the full forward, no encoding
    assert rows[8:] == [config.seq_len]
    if family == "masked":
        assert torch.equal(cached, full) and (cached != config.mask_id).any()
    else:
        assert torch.allclose(cached, full, atol=1e-5, rtol=0) and not torch.allclose(cached, start)
    assert torch.allclose(cached_logits, full_logits, atol=1e-5, rtol=0)
