import pytest
import torch

from swarm.errors import SwarmError
from swarm.model.denoiser import MASK_ID, ModelConfig, build_block, build_end_to_end, count_parameters


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
        target, level = torch.randint(0, MASK_ID + 1, (3, config.gen_len)), torch.full((3,), 0.3)
    logits = block(prefix, target, level)
    assert logits.shape == (3, config.gen_len, 256)
    assert torch.isfinite(logits).all()


def test_block_index_out_of_range_is_a_user_error(tiny_config):
    with pytest.raises(SwarmError, match="out of range"):
        build_block(tiny_config, tiny_config.n_blocks)
