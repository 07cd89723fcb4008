"""Training block b changes nothing of any other block, and never touches another block's tensors."""

import torch
from torch import nn

from swarm.model.denoiser import build_block
from swarm.model.train import TrainConfig, Trainer, block_trainer, diffusion_loss_fn


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_training_one_block_leaves_every_other_block_bit_identical(tiny_config, tiny_windows):
    torch.manual_seed(0)
    blocks = nn.ModuleList(build_block(tiny_config, b) for b in range(tiny_config.n_blocks))
    before = [snapshot(b) for b in blocks]
    forward_calls = {b: 0 for b in range(tiny_config.n_blocks)}
    for index, block in enumerate(blocks):
        block.register_forward_hook(lambda *_, index=index: forward_calls.__setitem__(index, forward_calls[index] + 1))

    trained = 1
    trainer = Trainer(blocks[trained], diffusion_loss_fn(blocks[trained], trained), tiny_windows, TrainConfig(steps=5))
    for _ in range(5):
        trainer.step()
        for other in range(tiny_config.n_blocks):
            if other != trained:
                assert all(p.grad is None for p in blocks[other].parameters()), f"block {other} got a gradient"

    for index, block in enumerate(blocks):
        after = snapshot(block)
        changed = any(not torch.equal(before[index][k], after[k]) for k in after)
        assert changed == (index == trained), f"block {index}: changed={changed}"
        assert (forward_calls[index] > 0) == (index == trained), f"block {index} ran {forward_calls[index]} times"


def test_block_trainer_holds_only_its_own_block(tiny_config, tiny_windows):
    trainer = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=2))
    trainer.step()
    own = sum(p.numel() for p in build_block(tiny_config, 0).parameters())
    held = sum(p.numel() for p in trainer.module.parameters())
    in_optimizer = sum(p.numel() for group in trainer.optimizer.param_groups for p in group["params"])
    assert held == own and in_optimizer == own
    assert len(trainer.module.layers) == tiny_config.layers_per_block


def test_blocks_trained_apart_draw_different_batches(tiny_config, tiny_windows):
    first = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=2))
    second = block_trainer(tiny_config, 1, tiny_windows, TrainConfig(steps=2))
    assert not torch.equal(first.windows.sample(4, first.generator), second.windows.sample(4, second.generator))
