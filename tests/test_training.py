"""The shared training loop actually learns, for a block and for both baselines."""

import pytest
import torch

from swarm.model.autoregressive import ByteTransformer, continuation_nll, generate_bytes, matched_depth
from swarm.model.denoiser import build_end_to_end, count_parameters
from swarm.model.train import TrainConfig, autoregressive_trainer, block_trainer, end_to_end_trainer


@pytest.mark.parametrize("make", ["block", "end_to_end", "autoregressive"])
def test_loss_falls_on_repetitive_text(tiny_config, tiny_windows, make):
    train_config = TrainConfig(steps=60, batch_size=16, warmup_steps=5)
    if make == "block":
        trainer = block_trainer(tiny_config, tiny_config.n_blocks - 1, tiny_windows, train_config)
    elif make == "end_to_end":
        trainer = end_to_end_trainer(tiny_config, tiny_windows, train_config)
    else:
        trainer = autoregressive_trainer(tiny_config, tiny_windows, train_config)
    for _ in range(60):
        trainer.step()
    first, last = sum(trainer.losses[:5]) / 5, sum(trainer.losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)


def test_autoregressive_baseline_matches_the_end_to_end_parameter_count(tiny_config):
    ar, e2e = ByteTransformer(tiny_config), build_end_to_end(tiny_config)
    per_layer = count_parameters(ar.layers[0])
    assert abs(count_parameters(ar) - count_parameters(e2e)) <= per_layer / 2 + 1
    assert len(ar.layers) == matched_depth(tiny_config)


def test_autoregressive_generation_agrees_with_one_teacher_forced_pass(tiny_config):
    torch.manual_seed(0)
    model = ByteTransformer(tiny_config).eval()
    prefix = torch.randint(0, 256, (2, tiny_config.prefix_len))
    greedy = generate_bytes(model, prefix, tiny_config.gen_len, torch.Generator())
    with torch.no_grad():
        logits = model(torch.cat([prefix, greedy], dim=1)[:, :-1])[:, tiny_config.prefix_len - 1 :]
        assert torch.equal(logits.argmax(dim=-1), greedy)
        nll = continuation_nll(model, prefix, greedy)
    expected = torch.nn.functional.cross_entropy(logits.transpose(1, 2), greedy, reduction="none").mean(dim=1)
    assert torch.allclose(nll, expected)
