"""Cost as a block grows: one block at sizes from 0.38 M to about 50 M parameters, through the real code.

Issue 28 asks how our costs grow with the model a user brings. Every figure here comes from the
library's own code paths, at each size given by --sizes (`DxL`: d_model D, L layers per block,
4 blocks, a head per 64 dimensions and at least 4; 128x1 is the sync benchmark's 0.38 M block,
1024x3 about 52 M):
- forward and backward: `Trainer.compute_gradients` (swarm/model/train.py) on a batch of
  --batch-size windows; beside it the plain AdamW update (`optimizer_step`), what a lone peer pays,
  SGD with momentum's step (`momentum_step_s`: the momentum and the weights updated in plain
  passes, the least any momentum optimizer does, DeMo included: a floor under its sync),
  and the same forward and backward with activation checkpointing (`TrainConfig.checkpoint_activations`:
  each layer's attention and MLP recomputed in the backward pass), its price in time;
- sync, with --replicas replicas (the others' payloads made by the same code from other batches
  and the same weights, as replicas that stay identical would): DeMo (`--sync demo`, and
  `demo-overlap`'s vote and step, the same code) through `DeMoOptimizer.make_payload` (compress,
  error feedback included), `encode_payload`, `decode_payload` of every payload (own included, as
  exchange.py does) and `apply`; apart from those (`step_ahead_s`, not in `sync_s`), what
  `demo-overlap` adds to each step at --overlap-steps 1: its step ahead (the weights kept, its
  own payload stepped alone: swarm/sync/overlap.py) and the weights put back before the set is
  applied (its memory, one more copy of the block, is not in the memory figures); outer steps
  (`outer`, `outer-overlap`) through `OuterOptimizer.make_payload` (compress
  and encode are one call there), `decode` and `apply`, after one local AdamW step from the
  anchor instead of H (the payload's size and cost do not depend on what the change holds), per
  round and per step (a round is H steps);
- bytes each replica sends per step: DeMo's payload to each of the others, the outer payload to
  each of the others once per round, and dense's fp32 all-reduce (hivemind's butterfly: every
  replica sends 2 (n - 1) / n of the gradients' bytes), computed from the parameter count, which
  benchmarks/sync.py measured within 2% of this at 0.38 M;
- peak RSS of a fresh process (spawned, one per size) that builds the block and trains it with
  AdamW for --memory-steps steps, beside the bytes of its weights, gradients and AdamW state
  counted from the tensors, and its RSS before the block was built (torch, the data, and
  torch's runtime warmed up by one step of a tiny block: the fixed overhead). What the peak
  holds beyond those is mostly activations, which grow with batch x length x d_model x layers,
  not with the parameters (d_model squared), so their share falls as the block grows; the same
  again in other fresh processes with activation checkpointing on (`memory_checkpointed`), and
  as `swarm-peer --low-memory` trains (`memory_low`: checkpointing, and freed tensors' memory
  returned to the system at once, swarm/peer/memory.py), each with its median step time;
- the checkpoint (swarm/model/checkpoint.py): its bytes, encode, decode, save (encode and an
  atomic, fsynced write) and load; the download time at 20 and 100 Mbit/s, computed as its bytes
  over the link plus the receiver's local work, measured (each chunk's sha256, the whole file's,
  the decode). With --through-peers that local part is instead a real download on 127.0.0.1
  (a checkpoint host and a client, each with its DHT node and libp2p daemon, through
  `download_verified`); over the lab's capped links it is not built (benchmarks/transfer.py
  measures downloads there, at one size);
- the spot check (`SpotCheck.measure`, swarm/checkpoints/choice.py) on its windows;
- one denoise request of one prompt at --steps-per-block steps: what the denoise service runs
  (`check_request`, swarm/serving/wire.py, and the family's `run_steps`), without the network.
With --device cuda the block, its training, sync and serving run on the GPU (the checkpoint's
bytes are made and hashed on the host, as a peer's are); each timer waits for the GPU's queued
work, and memory is judged by the GPU's peak allocation (`torch.cuda.max_memory_allocated`)
beside the block's state, the host's RSS still reported.
Every figure is the median of --repeats runs after one warm-up. Each is fitted against the
parameter count by least squares on log-log (its slope is in the JSON and the PNG's legend),
and the issue's targets are checked in the JSON.

    python benchmarks/scale.py                         # every default size: tens of minutes on 2 cores
    python benchmarks/scale.py --sizes 128x1 256x2     # a smoke run
    python benchmarks/scale.py --device cuda --threads 16
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from tqdm import tqdm

from swarm.checkpoints.choice import SPOT_CHECK_WINDOWS, SpotCheck
from swarm.checkpoints.chunks import chunk_hashes
from swarm.cli.console import setup_logging
from swarm.errors import SwarmError
from swarm.files import write_atomic, write_picture
from swarm.lab.trainjobs import peak_rss_bytes, reset_peak_rss
from swarm.model.checkpoint import decode_block, encode_block, load_block, save_block
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig, build_block, count_parameters
from swarm.model.families import family_of
from swarm.model.steps import Sampling
from swarm.model.train import TrainConfig, Trainer, block_trainer, checked_device
from swarm.peer.memory import return_freed_memory
from swarm.serving.wire import check_request
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer, Payload, decode_payload, encode_payload
from swarm.sync.overlap import DeMoOverlapSync
from swarm.sync.pseudo_gradient import OuterConfig, OuterOptimizer

logger = logging.getLogger("benchmarks.scale")

DEFAULT_SIZES = ["128x1", "256x2", "512x2", "768x3", "1024x3"]  # 0.38 M, 2.4 M, 9.0 M, 29 M, 52 M parameters
N_BLOCKS = 4
HEAD_DIM = 64
RATES_MBIT = (20, 100)  # a home link and a good one (benchmarks/regions.yaml)
WARM_UP_SIZE = "64x1"  # the block the memory process warms torch up with (train_for_memory)
TRAIN_BYTES = 4_000_000  # the child measuring memory gets this much training text, not the whole corpus
SYNC_OVER_STEP_TARGET = 0.05
RSS_OVER_STATE_TARGET = 1.5
DOWNLOAD_TIMEOUT_S = 600.0


def model_config(size: str) -> ModelConfig:
    """The model whose blocks have the size `DxL` (d_model D, L layers per block)."""
    try:
        d_model, layers = (int(part) for part in size.lower().split("x"))
    except ValueError:
        raise SwarmError(f"a size is DxL (d_model x layers per block), like 512x2, not {size!r}") from None
    heads = max(4, d_model // HEAD_DIM)
    return ModelConfig(d_model=d_model, n_layers=N_BLOCKS * layers, n_blocks=N_BLOCKS, n_heads=heads)


def parameters_of(config: ModelConfig) -> int:
    """A block's parameter count, without allocating its weights (sizes run smallest first, as
    the targets compare the smallest with the largest)."""
    with torch.device("meta"):
        return count_parameters(build_block(config, 0))


def wait_for_device() -> None:
    """A GPU runs queued work after the call that queued it returns: a timer stops once it is done."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """fn(*args) and the seconds it took, its work on the GPU included."""
    wait_for_device()
    started = time.perf_counter()
    result = fn(*args)
    wait_for_device()
    return result, time.perf_counter() - started


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The median time of `repeats` calls after one warm-up call (first calls allocate and fill caches)."""
    fn()
    return statistics.median(timed(fn)[1] for _ in range(repeats))


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# --- training and sync ----------------------------------------------------------------------------------


def measure_training(trainer: Trainer, repeats: int) -> dict:
    """Forward and backward of one batch, the plain AdamW update after it, and forward and backward
    with activation checkpointing, taken in turn with the plain one (a drift of the machine's speed
    shows in both)."""
    forward_backward, update, momentum, checkpointed = [], [], [], []
    trainer.step()  # warm-up
    momentum_step = momentum_stepper(trainer.module)
    momentum_step()  # warm-up
    with activations_checkpointed(trainer):
        trainer.compute_gradients()  # warm-up
    for _ in range(repeats):
        forward_backward.append(timed(trainer.compute_gradients)[1])
        momentum.append(timed(momentum_step)[1])
        update.append(timed(trainer.optimizer_step)[1])
        with activations_checkpointed(trainer):
            checkpointed.append(timed(trainer.compute_gradients)[1])
    return {"forward_backward_s": statistics.median(forward_backward), "adamw_step_s": statistics.median(update),
            "momentum_step_s": statistics.median(momentum),
            "forward_backward_checkpointed_s": statistics.median(checkpointed)}  # fmt: skip


def momentum_stepper(module: torch.nn.Module) -> Callable[[], None]:
    """SGD with momentum's step on the block, as plain passes over its tensors: the momentum
    decayed and the gradient added, the weights moved by it. The least any momentum optimizer
    touches each step (DeMo keeps a momentum and steps every weight too): a floor under its sync."""
    params = [p for p in module.parameters() if p.grad is not None]
    momenta = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step() -> None:
        for param, momentum in zip(params, momenta):
            momentum.mul_(0.95).add_(param.grad)
            param.add_(momentum, alpha=-1e-3)

    return step


@contextmanager
def activations_checkpointed(trainer: Trainer) -> Iterator[None]:
    """The trainer's passes recompute each layer's activations in the backward pass, within the block."""
    trainer.config.checkpoint_activations = True
    try:
        yield
    finally:
        trainer.config.checkpoint_activations = False


def dense_bytes_per_step(parameters: int, replicas: int) -> float:
    """What each replica sends in hivemind's all-reduce of fp32 gradients: its parts to the other
    reducers and its averaged part back to them, 2 (n - 1) / n of the gradients' bytes."""
    return 2 * (replicas - 1) / replicas * 4 * parameters


def measure_demo(trainer: Trainer, names: list[str], repeats: int) -> dict:
    """One replica's DeMo step beside `len(names) - 1` others: their payloads come from their own
    optimizers and batches, once; the measured replica makes, encodes, decodes and applies anew
    each time."""
    lr = trainer.config.lr_at(trainer.step_count)  # as DeMoSync scales the momentum
    optimizers = {name: DeMoOptimizer(trainer.module, DeMoConfig(), trainer.config.lr) for name in names}
    own, value_bits = names[0], DeMoConfig().value_bits
    wire = {}
    for name in names[1:]:
        trainer.compute_gradients()
        wire[name] = encode_payload(optimizers[name].make_payload(lr), value_bits)
    parts: dict[str, list[float]] = {"compress_s": [], "encode_s": [], "decode_s": [], "apply_s": []}
    overlap, ahead = DeMoOverlapSync(optimizers[own], exchange=None), []  # its step ahead alone: no exchange
    for i in range(repeats + 1):  # the first is a warm-up (and makes the step ahead's copy of the block)
        trainer.compute_gradients()
        payload, compress = timed(optimizers[own].make_payload, lr)
        wire[own], encode = timed(encode_payload, payload, value_bits)
        gathered, decode = timed(lambda: [(name, decode_payload(wire[name], optimizers[own])) for name in sorted(wire)])
        _, apply = timed(optimizers[own].apply, gathered, own)
        _, step_ahead = timed(step_ahead_and_back, overlap, payload)
        if i:
            for key, seconds in zip(parts, (compress, encode, decode, apply)):
                parts[key].append(seconds)
            ahead.append(step_ahead)
    figures = {key: statistics.median(values) for key, values in parts.items()}
    payload_bytes = len(wire[own])
    return {**figures, "sync_s": sum(figures.values()), "step_ahead_s": statistics.median(ahead),
            "payload_bytes": payload_bytes, "bytes_per_replica_per_step": (len(names) - 1) * payload_bytes}  # fmt: skip


def step_ahead_and_back(overlap: DeMoOverlapSync, payload: Payload) -> None:
    """What `demo-overlap` adds to each step with one step in flight, through its own code: keep
    the weights and step this payload alone on them, then put them back (once the set is in);
    the weights end as they began, so the next repeat measures the same."""
    overlap._step_ahead([payload])
    overlap._step_back()


@torch.no_grad()
def restore(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    for name, param in module.named_parameters():
        param.copy_(weights[name])


def measure_outer(trainer: Trainer, names: list[str], repeats: int) -> dict:
    """One replica's outer round beside `len(names) - 1` others, all from the same anchor, each
    after a local AdamW step on its own batch; per round, and per step (a round is H steps)."""
    config = OuterConfig()
    optimizers = {name: OuterOptimizer(trainer.module, config, trainer.config.lr) for name in names}
    own, anchor = names[0], optimizers[names[0]].weights()
    wire = {}
    for name in names[1:]:
        restore(trainer.module, anchor)
        trainer.step()
        wire[name] = optimizers[name].make_payload()
    restore(trainer.module, anchor)
    parts: dict[str, list[float]] = {"compress_and_encode_s": [], "decode_s": [], "apply_s": []}
    for i in range(repeats + 1):  # the first is a warm-up
        trainer.step()
        wire[own], make = timed(optimizers[own].make_payload)
        decoded, decode = timed(lambda: [(name, optimizers[own].decode(wire[name])) for name in sorted(wire)])
        _, apply = timed(optimizers[own].apply, decoded, own)
        if i:
            for key, seconds in zip(parts, (make, decode, apply)):
                parts[key].append(seconds)
    per_round = {key: statistics.median(values) for key, values in parts.items()}
    round_s, payload_bytes = sum(per_round.values()), len(wire[own])
    return {**per_round, "round_s": round_s, "steps_per_round": config.steps, "sync_s": round_s / config.steps,
            "payload_bytes": payload_bytes,
            "bytes_per_replica_per_step": (len(names) - 1) * payload_bytes / config.steps}  # fmt: skip


def measure_sync(trainer: Trainer, replicas: int, repeats: int) -> dict:
    """Every sync mode's cost per step, and its bytes against dense's."""
    names = [f"r{i}" for i in range(replicas)]
    dense = dense_bytes_per_step(count_parameters(trainer.module), replicas)
    modes = {"demo": measure_demo(trainer, names, repeats)}
    gc.collect()
    modes["outer"] = measure_outer(trainer, names, repeats)
    for figures in modes.values():
        figures["dense_over_mode"] = dense / figures["bytes_per_replica_per_step"]
    modes["dense"] = {"bytes_per_replica_per_step": dense, "dense_over_mode": 1.0}
    return modes


# --- memory, in a fresh process per size ------------------------------------------------------------------


def train_for_memory(job: dict) -> dict:
    """Runs in a spawned process: train the block with AdamW (activations checkpointed or not,
    freed memory returned or not, as the job says); its peak RSS (and on a GPU, its peak
    allocation there) beside its tensors' bytes, and the median time of its steps after the first."""
    returned = job["return_freed"] and return_freed_memory()  # first, as the peer does
    torch.set_num_threads(job["threads"])
    config, device = ModelConfig.from_dict(job["config"]), job["device"]
    windows = Windows(job["train"], config.seq_len)
    train_config = TrainConfig(batch_size=job["batch_size"], checkpoint_activations=job["checkpoint_activations"])
    warm_up(windows, train_config, device)
    overhead = psutil.Process().memory_info().rss  # torch, its runtime, the data: what any size pays
    reset_peak_rss()
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
        gpu_overhead = torch.cuda.memory_allocated(device)
    trainer = block_trainer(config, job["block"], windows, train_config, device)
    steps_s = [timed(trainer.step)[1] for _ in range(job["steps"])]
    params = list(trainer.module.parameters())
    states = [t for state in trainer.optimizer.state.values() for t in state.values() if t.dim() > 0]  # no step counts
    figures = {"peak_rss_bytes": peak_rss_bytes(), "overhead_bytes": overhead, "weights_bytes": tensor_bytes(params),
               "gradient_bytes": tensor_bytes(p.grad for p in params), "optimizer_bytes": tensor_bytes(states),
               "step_s": statistics.median(steps_s[1:] or steps_s), "freed_memory_returned": returned}  # fmt: skip
    if on_gpu:
        figures |= {"peak_gpu_bytes": torch.cuda.max_memory_allocated(device), "gpu_overhead_bytes": gpu_overhead}
    return figures


def warm_up(windows: Windows, train_config: TrainConfig, device: str) -> None:
    """One step of the smallest block there is, thrown away: the first step of any model loads
    torch's kernels and thread pools and grows its allocator's arenas, which no size's own
    tensors cause and the process keeps (they count in the fixed overhead, not against the block)."""
    trainer = block_trainer(model_config(WARM_UP_SIZE), 0, windows, train_config, device)
    trainer.step()
    del trainer
    gc.collect()


# each memory figure's key: (activations checkpointed, freed memory returned to the system, its target's name)
MEMORY_MODES = {"memory": (False, False, ""), "memory_checkpointed": (True, False, ", activations checkpointed"),
                "memory_low": (True, True, ", --low-memory")}  # fmt: skip


def measure_memory(config: ModelConfig, train: torch.Tensor, args, mode: str = "memory") -> dict:
    """The block's peak memory where it lives (the host, or the GPU) above what any size pays,
    beside its state, trained as `mode` (a key of MEMORY_MODES) says."""
    checkpoint_activations, return_freed, _ = MEMORY_MODES[mode]
    job = {"config": config.to_dict(), "train": train[:TRAIN_BYTES].clone(), "block": args.block,
           "batch_size": args.batch_size, "steps": args.memory_steps, "threads": args.threads,
           "device": args.device, "checkpoint_activations": checkpoint_activations,
           "return_freed": return_freed}  # fmt: skip
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        figures = pool.submit(train_for_memory, job).result()
    state = figures["weights_bytes"] + figures["gradient_bytes"] + figures["optimizer_bytes"]
    if "peak_gpu_bytes" in figures:
        judged, above = "GPU allocation", figures["peak_gpu_bytes"] - figures["gpu_overhead_bytes"]
    else:
        judged, above = "host RSS", figures["peak_rss_bytes"] - figures["overhead_bytes"]
    return {**figures, "state_bytes": state, "judged": judged, "peak_above_overhead_bytes": above,
            "peak_above_overhead_over_state": above / state}  # fmt: skip


# --- checkpoints, spot check, serving ---------------------------------------------------------------------


def receive_locally(data: bytes, config: ModelConfig, block: int) -> None:
    """The receiver's own work on a checkpoint: every chunk's sha256, the whole file's, the decode."""
    chunk_hashes(data)
    hashlib.sha256(data).hexdigest()
    decode_block(data, config, block)


def download_through_peers(data: bytes, config: ModelConfig, block: int) -> float:
    """Seconds of one real download of `data` on 127.0.0.1: a checkpoint host and a fresh client,
    each with its own DHT node and libp2p daemon, through `download_verified`."""
    from swarm.checkpoints.download import download_verified  # hivemind's daemons: only with --through-peers
    from swarm.lab.hosting import CheckpointHost
    from swarm.p2p.client import SwarmClient
    from swarm.p2p.network import NetworkOptions

    with tempfile.TemporaryDirectory() as folder, CheckpointHost(Path(folder), "scale", block, config=config) as host:
        info = host.put(data, step=1)
        with SwarmClient("scale", NetworkOptions(initial_peers=host.maddrs)) as client:
            coro = download_verified(client.p2p, [host.host(info)], config, block, show_progress=False)
            return timed(lambda: client.run(coro, DOWNLOAD_TIMEOUT_S))[1]


def measure_checkpoint(module: torch.nn.Module, config: ModelConfig, args) -> dict:
    """Bytes, encode, decode, save and load of the block's checkpoint; download times at each rate."""
    block, repeats = args.block, args.repeats
    data = encode_block(module, config, block, step=1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "block.safetensors"
        figures = {"bytes": len(data),
                   "encode_s": median_seconds(lambda: encode_block(module, config, block, step=1), repeats),
                   "decode_s": median_seconds(lambda: decode_block(data, config, block), repeats),
                   "save_s": median_seconds(lambda: save_block(path, module, config, block, step=1), repeats),
                   "load_s": median_seconds(lambda: load_block(path, config, block), repeats)}  # fmt: skip
    if args.through_peers:
        figures["local_s"], figures["local"] = download_through_peers(data, config, block), "a download on 127.0.0.1"
    else:
        figures["local_s"] = median_seconds(lambda: receive_locally(data, config, block), repeats)
        figures["local"] = "the receiver's chunk checks and decode"
    figures["download_s"] = {str(rate): 8 * len(data) / (rate * 1e6) + figures["local_s"] for rate in RATES_MBIT}
    return figures


def measure_spot_check(module: torch.nn.Module, config: ModelConfig, validation: torch.Tensor, args) -> float:
    spot_check = SpotCheck(Windows(validation, config.seq_len).fixed(args.spot_check_windows))
    return median_seconds(lambda: spot_check.measure(module, config, args.block), args.repeats)


def measure_denoise(module: torch.nn.Module, config: ModelConfig, args) -> float:
    """One request of one prompt, every target byte hidden, along the block's schedule (a step
    costs the same whatever is hidden): the checks and the steps the denoise service runs for it."""
    if config.family != "masked":
        raise SwarmError("the denoise figure is built for the masked family (the default)")
    family = family_of(config)
    prefix = torch.randint(0, config.vocab_size, (1, config.prefix_len), generator=torch.Generator().manual_seed(0))
    tensors = [prefix, torch.full((1, config.gen_len), config.mask_id),
               family.schedule(args.block, args.steps_per_block)]

    def request() -> None:
        with torch.no_grad():
            family.run_steps(module.eval(), *check_request(family, config, tensors), seed=0, sampling=Sampling())

    return median_seconds(request, args.repeats)


# --- one size ------------------------------------------------------------------------------------------------


def measure_size(size: str, corpus, args, bar: tqdm) -> dict:
    config = model_config(size)
    train = corpus.windows("train", config)
    trainer = block_trainer(config, args.block, train, TrainConfig(batch_size=args.batch_size), args.device)
    parameters = count_parameters(trainer.module)
    logger.info("%s: %s parameters", size, f"{parameters:,}")
    result: dict[str, Any] = {"size": size, "d_model": config.d_model, "layers_per_block": config.layers_per_block,
                              "n_heads": config.n_heads, "vocab_size": config.vocab_size, "tokenizer": config.tokenizer,
                              "parameters": parameters}  # fmt: skip
    stages = {"training": lambda: measure_training(trainer, args.repeats),
              "sync": lambda: {"sync": measure_sync(trainer, args.replicas, args.repeats)},
              "checkpoint": lambda: {"checkpoint": measure_checkpoint(trainer.module, config, args)},
              "spot check": lambda: {"spot_check_s": measure_spot_check(
                  trainer.module, config, corpus.stream("validation", config.units()), args)},
              "denoise": lambda: {"denoise_s": measure_denoise(trainer.module, config, args)},
              "memory": lambda: {mode: measure_memory(config, corpus.stream("train", config.units()), args, mode)
                                 for mode in MEMORY_MODES}}  # fmt: skip
    for stage, measure in stages.items():
        bar.set_postfix_str(f"{size}: {stage}")
        result.update(measure())
        gc.collect()
    for mode in ("demo", "outer"):
        result["sync"][mode]["over_forward_backward"] = result["sync"][mode]["sync_s"] / result["forward_backward_s"]
    return result


# --- fits, targets, picture ----------------------------------------------------------------------------------

# every figure fitted against the parameter count: its name in the JSON's slopes, and where it is in a size's results
FIGURES: dict[str, tuple[str, ...]] = {
    "forward_backward_s": ("forward_backward_s",), "adamw_step_s": ("adamw_step_s",),
    "momentum_step_s": ("momentum_step_s",),
    "forward_backward_checkpointed_s": ("forward_backward_checkpointed_s",),
    "demo_sync_s": ("sync", "demo", "sync_s"), "demo_compress_s": ("sync", "demo", "compress_s"),
    "demo_encode_s": ("sync", "demo", "encode_s"), "demo_decode_s": ("sync", "demo", "decode_s"),
    "demo_apply_s": ("sync", "demo", "apply_s"), "demo_step_ahead_s": ("sync", "demo", "step_ahead_s"),
    "outer_sync_s": ("sync", "outer", "sync_s"),
    "outer_compress_and_encode_s": ("sync", "outer", "compress_and_encode_s"),
    "outer_decode_s": ("sync", "outer", "decode_s"), "outer_apply_s": ("sync", "outer", "apply_s"),
    "dense_bytes_per_step": ("sync", "dense", "bytes_per_replica_per_step"),
    "demo_bytes_per_step": ("sync", "demo", "bytes_per_replica_per_step"),
    "outer_bytes_per_step": ("sync", "outer", "bytes_per_replica_per_step"),
    "peak_rss_bytes": ("memory", "peak_rss_bytes"), "peak_gpu_bytes": ("memory", "peak_gpu_bytes"),
    "peak_rss_checkpointed_bytes": ("memory_checkpointed", "peak_rss_bytes"),
    "peak_gpu_checkpointed_bytes": ("memory_checkpointed", "peak_gpu_bytes"),
    "peak_rss_low_memory_bytes": ("memory_low", "peak_rss_bytes"),
    "step_s": ("memory", "step_s"), "step_low_memory_s": ("memory_low", "step_s"),
    "state_bytes": ("memory", "state_bytes"),
    "overhead_bytes": ("memory", "overhead_bytes"), "checkpoint_bytes": ("checkpoint", "bytes"),
    "checkpoint_save_s": ("checkpoint", "save_s"), "checkpoint_load_s": ("checkpoint", "load_s"),
    "download_20mbit_s": ("checkpoint", "download_s", "20"), "download_100mbit_s": ("checkpoint", "download_s", "100"),
    "spot_check_s": ("spot_check_s",), "denoise_s": ("denoise_s",),
}  # fmt: skip
PANELS = {  # the PNG's panels: title, then the figures drawn in it
    "seconds per training step": ["forward_backward_s", "forward_backward_checkpointed_s", "adamw_step_s",
                                  "momentum_step_s", "step_s", "step_low_memory_s", "demo_sync_s", "outer_sync_s"],
    "seconds per sync part (outer: per round)": ["demo_compress_s", "demo_encode_s", "demo_decode_s", "demo_apply_s",
                                                 "demo_step_ahead_s", "outer_compress_and_encode_s", "outer_decode_s",
                                                 "outer_apply_s"],
    "bytes per replica per step; checkpoint bytes": ["dense_bytes_per_step", "demo_bytes_per_step",
                                                     "outer_bytes_per_step", "checkpoint_bytes"],
    "bytes of memory": ["peak_rss_bytes", "peak_rss_checkpointed_bytes", "peak_rss_low_memory_bytes", "peak_gpu_bytes",
                        "peak_gpu_checkpointed_bytes", "state_bytes", "overhead_bytes"],
    "checkpoint seconds": ["checkpoint_save_s", "checkpoint_load_s", "download_20mbit_s", "download_100mbit_s"],
    "seconds per check or request": ["spot_check_s", "denoise_s"],
}  # fmt: skip


def figure_of(size: dict, name: str) -> float | None:
    """The figure `name` of one size's results; None where this run has no such figure (the GPU's on a CPU run)."""
    value: Any = size
    for key in FIGURES[name]:
        if key not in value:
            return None
        value = value[key]
    return value


def slopes(sizes: list[dict]) -> dict[str, float | None]:
    """Each figure's slope against the parameter count on log-log (least squares): 1 is linear
    growth; None where fewer than two sizes have a positive figure."""
    fitted = {}
    for name in FIGURES:
        points = [(s["parameters"], v) for s in sizes if (v := figure_of(s, name)) is not None and v > 0]
        if len({p for p, _ in points}) < 2:
            fitted[name] = None
            continue
        x, y = np.log([p for p, _ in points]), np.log([v for _, v in points])
        fitted[name] = float(np.polyfit(x, y, 1)[0])
    return fitted


def targets(sizes: list[dict]) -> dict:
    """The issue's targets, each with the figure judged and whether it is met."""
    checks = {}
    for mode in ("demo", "outer"):
        worst = max(s["sync"][mode]["over_forward_backward"] for s in sizes)
        checks[f"{mode} sync / forward+backward, largest over sizes"] = {
            "figure": worst, "target": f"<= {SYNC_OVER_STEP_TARGET}", "met": worst <= SYNC_OVER_STEP_TARGET}
        first, last = sizes[0]["sync"][mode]["dense_over_mode"], sizes[-1]["sync"][mode]["dense_over_mode"]
        checks[f"{mode} dense/mode bytes, largest size over smallest"] = {
            "figure": last / first, "target": ">= 1", "met": last >= first}
    for key, (_, _, how) in MEMORY_MODES.items():
        if key in sizes[0]:  # runs before --low-memory lack its figure
            checks.update(memory_target(sizes, key, how))
    return checks


def memory_target(sizes: list[dict], key: str, how: str) -> dict:
    """The memory target on the figures under `key` (a MEMORY_MODES key: `how` says which in the target's name)."""
    worst = max(s[key]["peak_above_overhead_over_state"] for s in sizes)
    judged = sizes[0][key].get("judged", "host RSS")
    overhead = "overhead_bytes" if judged == "host RSS" else "gpu_overhead_bytes"
    return {f"(peak {judged} - overhead) / (weights + gradients + AdamW){how}, largest over sizes": {
        "figure": worst, "target": f"<= {RSS_OVER_STATE_TARGET}", "met": worst <= RSS_OVER_STATE_TARGET,
        "overhead_bytes": max(s[key][overhead] for s in sizes)}}  # fmt: skip


def plot(sizes: list[dict], fitted: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    x = [s["parameters"] for s in sizes]
    for ax, (title, names) in zip(axes.flat, PANELS.items()):
        for name in (name for name in names if figure_of(sizes[0], name) is not None):
            slope = fitted[name]
            label = f"{name} (slope {slope:.2f})" if slope is not None else name
            ax.plot(x, [figure_of(s, name) for s in sizes], marker="o", label=label)
        ax.set(xscale="log", yscale="log", title=title, xlabel="parameters of the block")
        ax.legend(fontsize=7)
    fig.tight_layout()
    write_picture(path, fig, dpi=100)
    plt.close(fig)


# --- the program -----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="DxL: d_model x layers per block")
    parser.add_argument("--batch-size", type=int, default=TrainConfig().batch_size)
    parser.add_argument("--replicas", type=int, default=4, help="replicas whose payloads a step gathers")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (after a warm-up); the median counts")
    parser.add_argument("--memory-steps", type=int, default=3, help="AdamW steps of the process whose peak RSS counts")
    parser.add_argument("--spot-check-windows", type=int, default=SPOT_CHECK_WINDOWS,
                        help="validation windows the spot check measures (the library's own count)")
    parser.add_argument("--steps-per-block", type=int, default=4, help="denoising steps of one request")
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (this machine's cores)")
    parser.add_argument("--device", default="cpu", help="where the block trains and serves: cpu, cuda, cuda:1")
    parser.add_argument("--through-peers", action="store_true",
                        help="download each checkpoint once through real peers on 127.0.0.1 (starts DHT nodes)")
    parser.add_argument("--data", default=None, help="the text to train on (default: the built-in corpus)")
    parser.add_argument("--note", default=None,
                        help="what a reader should know about this run (on the benchmarks page)")
    parser.add_argument("--out", default="benchmarks/results/scale")
    args = parser.parse_args(argv)
    if args.replicas < 2 or args.repeats < 1:
        parser.error("--replicas must be at least 2 and --repeats at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging()
    torch.set_num_threads(args.threads)
    try:
        checked_device(args.device)
        counts = [parameters_of(model_config(size)) for size in args.sizes]  # every size checked before any runs
        sizes = [args.sizes[i] for i in np.argsort(counts, kind="stable")]
        corpus, results = load_corpus(args.data), []
        with tqdm(sizes, desc="sizes", unit="size") as bar:
            for size in bar:
                results.append(measure_size(size, corpus, args, bar))
                report = write_report(args, sizes, results)  # after each size: a run cut short keeps what it measured
    except SwarmError as error:
        print(f"scale.py: error: {error}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(report, indent=2))


def write_report(args: argparse.Namespace, sizes: list[str], results: list[dict]) -> dict:
    """The JSON and PNG of the sizes measured so far (`complete` once every default size is among them)."""
    fitted = slopes(results)
    settings = {key: value for key, value in vars(args).items() if key not in ("out", "note")}
    measured = [result["size"] for result in results]
    report = {"settings": {**settings, "sizes": sizes}, "note": args.note,
              "complete": set(DEFAULT_SIZES) <= set(measured),  # every default size measured: not a smoke run
              "sizes": results, "slopes": fitted, "targets": targets(results)}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "scale.json", (json.dumps(report, indent=2) + "\n").encode())
    plot(results, fitted, out / "scale.png")
    return report


if __name__ == "__main__":
    main()
