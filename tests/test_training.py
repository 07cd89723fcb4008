"""The shared training loop actually learns, for a block and for both baselines."""

import platform
import subprocess
import sys

import pytest
import torch

from swarm.model.autoregressive import ByteTransformer, continuation_nll, generate_bytes, matched_depth
from swarm.model.denoiser import TransformerLayer, build_end_to_end, count_parameters
from swarm.model.train import TrainConfig, autoregressive_trainer, block_trainer, end_to_end_trainer

TRAINERS = {  # each kind of trainer, built from (config, windows, train config)
    "block": lambda config, windows, train: block_trainer(config, config.n_blocks - 1, windows, train),
    "end_to_end": end_to_end_trainer,
    "autoregressive": autoregressive_trainer,
}


@pytest.mark.parametrize("make", TRAINERS)
def test_loss_falls_on_repetitive_text(tiny_config, tiny_windows, make):
    # a tiny model on repetitive text, at a rate that shows learning within 60 steps (the default
    # rates suit the default model on real text: train.py's default_lr)
    trainer = TRAINERS[make](tiny_config, tiny_windows, TrainConfig(steps=60, batch_size=16, warmup_steps=5, lr=2e-3))
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


def test_spare_batches_leave_the_weights_and_join_the_next_steps_gradient(tiny_config, tiny_windows):
    """What a replica computes while it waits for the others: `spare_batch` changes no weight, and
    the next step's gradient is the mean over its own batch and the spare windows, each window
    weighing the same (checked against the gradients of the same draws, taken one by one)."""
    config = TrainConfig(batch_size=8, grad_clip=1e9)
    trainer, twin = (block_trainer(tiny_config, 0, tiny_windows, config) for _ in range(2))  # same weights, same draws
    before = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    trainer.spare_batch(4)
    trainer.spare_batch(2)
    assert all(torch.equal(v, before[k]) for k, v in trainer.module.state_dict().items())
    assert all(p.grad is None for p in trainer.module.parameters()) and trainer.spare_windows == 6
    trainer.compute_gradients()  # what the step's update (AdamW, or a sync strategy's) then finds in .grad
    seen = [p.grad.clone() for p in trainer.module.parameters() if p.requires_grad]

    params = [p for p in twin.module.parameters() if p.requires_grad]

    def gradients(windows: int) -> tuple:
        window = twin.windows.sample(windows, twin.generator)
        return torch.autograd.grad(twin.loss_fn(window, twin.generator), params)

    four, two, own = gradients(4), gradients(2), gradients(8)
    for got, a, b, c in zip(seen, four, two, own, strict=True):
        torch.testing.assert_close(got, (4 * a + 2 * b + 8 * c) / 14, rtol=1e-5, atol=1e-7)
    assert not torch.equal(own[0], seen[0])  # the spare windows did count
    assert trainer.spare_windows == 0 and trainer.spare_gradients is None  # used once


@pytest.fixture
def layer_runs(monkeypatch) -> list[int]:
    """A list that gets one entry per pass of any transformer layer's MLP (forward or recomputed)."""
    runs: list[int] = []
    original = TransformerLayer._feed_forward

    def counted(self, *args, **kwargs):
        runs.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TransformerLayer, "_feed_forward", counted)
    return runs


@pytest.mark.parametrize("make", TRAINERS)
def test_checkpointed_activations_are_recomputed_and_give_the_same_gradients(
    tiny_config, tiny_windows, make, layer_runs
):
    """With checkpoint_activations every layer's MLP runs twice in a step (its forward, then again in the
    backward pass), and the gradients are those of the plain step on the same batch and draws."""
    gradients, passes = {}, {}
    for on in (False, True):
        trainer = TRAINERS[make](tiny_config, tiny_windows, TrainConfig(batch_size=8, checkpoint_activations=on))
        layer_runs.clear()
        trainer.compute_gradients()
        passes[on] = len(layer_runs)
        gradients[on] = [p.grad for p in trainer.module.parameters()]
    layers = len(trainer.module.layers)
    assert passes == {False: layers, True: 2 * layers}
    for plain, checkpointed in zip(gradients[False], gradients[True], strict=True):
        assert torch.allclose(plain, checkpointed, rtol=0, atol=1e-6)


def test_checkpointed_layers_run_once_outside_training(tiny_config, tiny_windows, layer_runs):
    """Evaluation keeps its plain pass, even with gradients on (a layer in eval mode is not recomputed)."""
    trainer = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(batch_size=4, checkpoint_activations=True))
    trainer.compute_gradients()  # the trainer's setting is now on the module's layers
    window = tiny_windows.sample(4, torch.Generator().manual_seed(1))
    layer_runs.clear()
    trainer.module.eval()
    trainer.loss_fn(window, torch.Generator().manual_seed(2)).backward()
    assert len(layer_runs) == len(trainer.module.layers)


def test_swarm_peer_low_memory_checkpoints_the_trainers_activations(parsed):
    """--low-memory is off unless given, and given, activation checkpointing is on in the config the peer's
    trainer is built from."""
    given = [parsed(*args) for args in ([], ["--low-memory"])]
    assert [config.low_memory for config in given] == [False, True]
    assert [config.train_config().checkpoint_activations for config in given] == [False, True]


def test_swarm_peer_schedule_steps_spans_the_schedule_and_max_steps_only_stops(monkeypatch):
    """--schedule-steps sets the learning rate's schedule apart from --max-steps: a peer told 900
    steps on a schedule of 600 trains the last 300 at the schedule's floor; without it the
    schedule spans --max-steps."""
    import peers.main

    given = []

    class Joined:
        def __init__(self, config, hooks):
            given.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr(peers.main, "Peer", Joined)
    for args in (["--max-steps", "900", "--schedule-steps", "600"], ["--max-steps", "900"]):
        peers.main.peer_command.main(args, standalone_mode=False)
    scheduled, plain = (config.train_config() for config in given)
    assert (scheduled.steps, plain.steps) == (600, 900)
    floor = scheduled.lr * scheduled.min_lr_fraction
    assert scheduled.lr_at(600) == pytest.approx(floor) and scheduled.lr_at(800) == pytest.approx(floor)
    assert plain.lr_at(800) > floor * 1.01


FREED_MEMORY_PROBE = """
import sys, torch
from swarm.peer.memory import return_freed_memory
if sys.argv[1] == "returned":
    assert return_freed_memory()
import os
resident = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
first = torch.ones(6 << 20)  # 24 MB, mapped apart at glibc's start: its free raises the threshold to its size
del first
before = resident()
tensors, pinned = [], []
for _ in range(6):
    tensors.append(torch.ones(4 << 20))  # 16 MB each, 96 MB in all
    pinned.append(torch.ones(1 << 16))  # 256 KB after each: the heap cannot shrink past them from its top
del tensors
print((resident() - before) / 1e6)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the threshold it sets is glibc's")
@pytest.mark.parametrize("returned", [False, True])
def test_low_memory_returns_freed_tensors_memory_to_the_system(returned):
    """With glibc's own threshold, six freed 16 MB tensors stay in the process's RSS; after
    `return_freed_memory` they leave it when freed (measured here: 102 MB held, 1.6 MB)."""
    mode = "returned" if returned else "held"
    probe = subprocess.run(
        [sys.executable, "-c", FREED_MEMORY_PROBE, mode], check=False, capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    held_mb = float(probe.stdout)
    assert held_mb < 10 if returned else held_mb > 80
