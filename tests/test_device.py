"""Device and dtype are taken from the block, never assumed (issue 28: `--device cuda` end to end).

There is no GPU here, so two stand-ins make a hidden assumption fail on the CPU:
- the block's weights are float64: a tensor made in float32 beside them (a DCT matrix, a decoded
  change) fails to combine with them or shows in an output's dtype; the model's own inputs (noise
  levels, embeddings) promote to float64 silently, so the training step and the denoise service
  also run a bfloat16 block, where a float32 input meets a narrower weight and fails;
- the calls run with "meta" as the default device (`ELSEWHERE`): a tensor made without a device
  taken from the block lands on meta, which holds no values, and fails to combine with the
  block's CPU tensors or shows in an output's device. On a GPU, likewise, the default device
  (the CPU) is not the block's.
What neither catches is a tensor born on the CPU (from bytes, numpy or a CPU generator) that is
never moved to the block's device; for the payload decode a block on the meta device checks
that, where the path needs no values.
"""

from __future__ import annotations

import itertools
import math
from contextlib import contextmanager

import pytest
import torch
from helpers import assert_one_line_error, run_command
from safetensors.torch import load as load_safetensors_bytes

from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block, encode_block
from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.evaluate import block_bits, block_denoise_ce, block_elbo_bits
from swarm.model.families import family_of
from swarm.model.steps import Sampling
from swarm.model.train import TrainConfig, Trainer, checked_device, diffusion_loss_fn
from swarm.peer.config import PeerConfig
from swarm.serving.server import DenoiseServicer
from swarm.serving.wire import check_request
from swarm.sync.compression import decompress, take_top_k, tile_coefficients
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer, decode_payload, encode_payload
from swarm.sync.exchange import Exchange
from swarm.sync.in_process import LocalBoard
from swarm.sync.modes import MODES, SyncInputs
from swarm.sync.pseudo_gradient import OuterConfig, OuterOptimizer
from swarm.sync.reconcile import Voice, median_of
from swarm.sync.strategy import train_step

MASK_ID = 256  # the mask unit of the tests' byte models (ModelConfig.mask_id)

WIDE = torch.float64  # not the default dtype: a hidden float32 fails
NARROW = torch.bfloat16  # a float32 input to a bfloat16 layer fails where float64 would promote it
ELSEWHERE = torch.device("meta")  # not the block's device: a tensor made without the block's device fails


def wide_block(config: ModelConfig, block: int = 0, seed: int = 0, dtype: torch.dtype = WIDE) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_block(config, block).to(dtype)


def wide_trainer(config: ModelConfig, windows, dtype: torch.dtype = WIDE) -> Trainer:
    """A float64 (or `dtype`) block's trainer, its AdamW state made by one step first: AdamW keeps
    its step count as a CPU scalar by torch's design, made at the first step on the default device."""
    block = wide_block(config, dtype=dtype)
    trainer = Trainer(block, diffusion_loss_fn(block, 0), windows, TrainConfig(steps=10, batch_size=4, warmup_steps=1))
    trainer.step()
    return trainer


def assert_like_block(tensors, dtype=WIDE) -> None:
    for tensor in tensors:
        assert tensor.device == torch.device("cpu") and tensor.dtype == dtype, (tensor.device, tensor.dtype)
        assert torch.isfinite(tensor).all()


class LoneAverager:
    """hivemind's averager as a block's dense sync sees it when its group is itself alone: float32
    copies on the CPU (as `block_averager` makes them), handed back as the group's average."""

    def __init__(self, tensors):
        self.tensors = [t.detach().to("cpu", torch.float32, copy=True) for t in tensors]

    @contextmanager
    def get_tensors(self):
        yield self.tensors

    def step(self, gather: str, timeout: float, allow_retries: bool) -> dict:
        return {"itself": gather}


def strategy(mode: str, trainer: Trainer):
    """The mode's strategy as the peer builds it (modes.py), for a replica with no others."""
    exchange = Exchange(LocalBoard(deadline=1.0).transport("me"), "me", replica_ids=list)  # no other replicas
    averager = LoneAverager([p for p in trainer.module.parameters() if p.requires_grad])
    inputs = SyncInputs(trainer.module, 2e-3, DeMoConfig(), OuterConfig(steps=2), 1, 1.0, exchange, averager)
    return MODES[mode].build(inputs)


@pytest.mark.parametrize("dtype", [WIDE, NARROW])
@pytest.mark.parametrize("family", ["masked", "gaussian"])
def test_a_training_step_runs_in_the_blocks_dtype_on_its_device(tiny_config, tiny_windows, family, dtype):
    config = ModelConfig(**{**tiny_config.to_dict(), "family": family})
    trainer = wide_trainer(config, tiny_windows, dtype)
    with ELSEWHERE:
        loss = trainer.step()
    assert math.isfinite(loss)
    assert_like_block(trainer.module.parameters(), dtype)
    assert_like_block((p.grad for p in trainer.module.parameters() if p.grad is not None), dtype)


@pytest.mark.parametrize("mode", list(MODES))
def test_every_sync_mode_steps_a_block_in_its_dtype_on_its_device(tiny_config, tiny_windows, mode):
    trainer = wide_trainer(tiny_config, tiny_windows)
    sync = strategy(mode, trainer)
    before = [p.detach().clone() for p in trainer.module.parameters()]
    with ELSEWHERE:
        for _ in range(4):  # two outer rounds; demo-overlap applies each step's set a step late
            train_step(trainer, sync)
        sync.settle(trainer)
    assert_like_block(trainer.module.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.module.parameters()))


def test_demo_vote_of_three_replicas_on_payloads_from_the_wire(tiny_config, tiny_windows):
    trainers = [wide_trainer(tiny_config, tiny_windows) for _ in range(3)]
    optimizers = [DeMoOptimizer(t.module, DeMoConfig(), lr=2e-3) for t in trainers]
    with ELSEWHERE:
        for trainer in trainers:
            trainer.compute_gradients()
        trainers[2].module.head.bias.grad = None  # a payload without a parameter votes zero on it
        wire = [encode_payload(o.make_payload(2e-3), 16) for o in optimizers]
        gathered = [(f"r{i}", decode_payload(data, optimizers[0])) for i, data in enumerate(wire)]
        voters = optimizers[0].apply(gathered, "r0")
    assert voters == ["r0", "r1", "r2"]
    assert_like_block(trainers[0].module.parameters())
    assert_like_block(optimizers[0].momentum.values())


def test_demo_payload_decoded_from_bytes_lands_on_the_blocks_device(tiny_config, tiny_windows):
    trainer = wide_trainer(tiny_config, tiny_windows)
    optimizer = DeMoOptimizer(trainer.module, DeMoConfig(), lr=2e-3)
    data = encode_payload(optimizer.make_payload(2e-3), 16)
    with torch.device("meta"):
        elsewhere = DeMoOptimizer(build_block(tiny_config, 0), DeMoConfig(), lr=2e-3)
    for sent in decode_payload(data, elsewhere).values():
        assert sent.indices.device == sent.values.device == ELSEWHERE


def test_outer_step_of_three_replicas_on_payloads_from_the_wire(tiny_config, tiny_windows):
    """Three replicas (the clipped mean) and two (the agreeing minimum and the record's share)."""
    trainers = [wide_trainer(tiny_config, tiny_windows) for _ in range(3)]
    for compression, replicas in itertools.product(("dct", "none"), (3, 2)):
        config = OuterConfig(steps=1, compression=compression)
        optimizers = [OuterOptimizer(t.module, config, lr=2e-3) for t in trainers[:replicas]]
        with ELSEWHERE:
            for trainer in trainers[:replicas]:
                trainer.step()
            changes = [(f"r{i}", optimizers[0].decode(o.make_payload())) for i, o in enumerate(optimizers)]
            assert optimizers[0].apply(changes, "r0") == [sender for sender, _ in changes]
        assert_like_block(change for _, replica in changes for change in replica.values())
        assert_like_block(trainers[0].module.parameters())
        assert_like_block(optimizers[0].error.values())


@pytest.mark.parametrize("value_bits", [32, 16, 1])
def test_compression_round_trip_keeps_the_tensors_device_and_a_dtype_at_least_float32(value_bits):
    def compress(tensor: torch.Tensor, top_k: int, value_bits: int):
        return take_top_k(tile_coefficients(tensor), tensor.shape, top_k, value_bits)

    momentum = torch.randn(64, 96, dtype=WIDE)
    with ELSEWHERE:
        received = decompress(compress(momentum, top_k=8, value_bits=value_bits))
        narrow = decompress(compress(momentum.to(NARROW), top_k=8, value_bits=value_bits))
        exact = decompress(compress(momentum, top_k=64 * 96, value_bits=32))
        kept = tile_coefficients(momentum)
        take_top_k(kept, momentum.shape, top_k=8, value_bits=value_bits)
    assert_like_block([kept, exact])
    assert_like_block([received], WIDE if value_bits == 32 else torch.float32)  # 16 bits: bfloat16 values
    assert_like_block([narrow], torch.float32)  # a bfloat16 tensor is compressed in float32
    assert torch.allclose(exact, momentum, atol=1e-12)  # a float32 DCT would be off by ~1e-7


def test_checkpoint_is_written_from_cpu_copies_in_the_blocks_dtype_and_decodes_on_the_cpu(tiny_config):
    block = wide_block(tiny_config)
    with ELSEWHERE:
        data = encode_block(block, tiny_config, 0, step=3)
        decoded, step = decode_block(data, tiny_config, 0)
    assert step == 3 and {t.dtype for t in load_safetensors_bytes(data).values()} == {WIDE}
    assert_like_block(decoded.parameters(), torch.float32)
    for ours, theirs in zip(block.parameters(), decoded.parameters()):
        assert torch.allclose(ours.float(), theirs)


@pytest.mark.parametrize("dtype", [WIDE, NARROW])
@pytest.mark.parametrize("family", ["masked", "gaussian"])
def test_the_denoise_service_computes_in_the_blocks_dtype_and_answers_on_the_wire(tiny_config, family, dtype):
    config = ModelConfig(**{**tiny_config.to_dict(), "family": family})
    block, servicer = wide_block(config, 1, dtype=dtype), DenoiseServicer(config, 1)
    servicer.swap_in(block, "")
    served = servicer._denoiser_for("")
    assert_like_block(served.parameters(), dtype)
    n, schedule = 2, family_of(config).schedule(1, 3)
    prefix = torch.randint(0, 256, (n, config.prefix_len))
    if family == "masked":
        state = torch.full((n, config.gen_len), MASK_ID)
    else:
        state = torch.randn(n, config.gen_len, config.d_model) * float(schedule[0])
    request = check_request(servicer.family, config, [prefix, state, schedule])
    with ELSEWHERE:
        answer, logits = servicer._run(served, *request, seed=7, sampling=Sampling(1.0))
    assert answer.device == state.device and answer.dtype == state.dtype and answer.shape == state.shape
    assert_like_block([logits], dtype)
    if family == "masked":
        assert not (answer == MASK_ID).any()  # block 1 of 2 ends at t = 0


class InputsSeen(torch.nn.Module):
    """A block on the meta device that records the devices of what it is handed, then stops the
    call (a meta tensor has no value to score)."""

    class Seen(Exception):
        pass

    def __init__(self, config: ModelConfig, block: int):
        super().__init__()
        with ELSEWHERE:
            self.block = build_block(config, block)
        self.config, self.devices = config, set()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        self.devices |= {x.device for x in inputs}
        raise self.Seen


# the spot check's, the bound's, the likelihood's
@pytest.mark.parametrize("figure", [block_denoise_ce, block_elbo_bits, block_bits])
@pytest.mark.parametrize("family", ["masked", "gaussian"])
def test_scoring_hands_the_block_its_windows_and_noise_on_the_blocks_device(tiny_config, tiny_windows, family, figure):
    """The windows and the draws are made on the CPU (the same on every device); a block on a GPU
    was handed them there (seen on the H200: the spot check failed, cuda:0 and cpu)."""
    config = ModelConfig(**{**tiny_config.to_dict(), "family": family})
    block = InputsSeen(config, 1)
    with pytest.raises(InputsSeen.Seen):
        figure(block, config, 1, tiny_windows.fixed(4))
    assert block.devices == {ELSEWHERE}


def test_the_median_of_drifted_replicas_keeps_their_dtype(tiny_config):
    states = [wide_block(tiny_config, seed=seed).state_dict() for seed in range(3)]
    with ELSEWHERE:
        merged = median_of([Voice(str(i), state, 1) for i, state in enumerate(states)])
    assert_like_block(merged.values())
    stacked = torch.stack([s["head.bias"] for s in states])
    assert torch.equal(merged["head.bias"], stacked.median(dim=0).values)


def test_a_device_this_machine_lacks_is_refused_in_one_line():
    with pytest.raises(SwarmError, match="--device"):
        checked_device("no-such-device")
    with pytest.raises(SwarmError, match="--device"):
        PeerConfig(device="no-such-device").checked()
    assert checked_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: there is no unavailable device to ask for")
    assert_one_line_error(run_command("swarm-train", "--device", "cuda", "--steps", "1"), "--device cuda")
