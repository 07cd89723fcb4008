"""Training jobs for the quality benchmarks: one model per fresh process, one job after another.

A job (a dict, so that it crosses a process boundary) names the kind of model (a block, the
end-to-end denoiser, the autoregressive baseline), its config, the training and validation
streams, the schedule and how many steps to run of it; its learning rate is its kind's own
(`default_lr`) unless the job names one. Each runs in its own spawned process,
so that its peak memory is its own, and none runs beside another, so that none steals the
others' cores. A job records a validation curve on the way: its likelihood in bits per byte
against its training seconds (the time in forward, backward and update).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import math
import multiprocessing as mp
import os
import signal
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil
import torch

from swarm.model.checkpoint import save_block, save_model_folder
from swarm.model.data import Windows
from swarm.model.denoiser import ModelConfig, count_parameters
from swarm.model.evaluate import bits_per_byte, block_bits, judge_nll, units_per_byte
from swarm.model.train import (
    TrainConfig,
    Trainer,
    autoregressive_trainer,
    block_trainer,
    default_lr,
    end_to_end_trainer,
    train,
)

CURVE_WINDOWS = 64
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def reset_peak_rss() -> None:
    """Reset the kernel's high-water mark of this process's RSS (Linux), so the peak is the trainer's."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@torch.no_grad()
def bits_per_byte_now(trainer: Trainer, kind: str, block: int | None, windows: torch.Tensor) -> float:
    """The trainer's module's bits per byte on fixed windows, the figure its final score gives
    (swarm/model/evaluate.py): a denoiser's (for a block, its own share), the teacher-forced
    cross-entropy of the autoregressive model on the same target units, per byte of their text."""
    # figured on the host
    module = trainer.module if trainer.device.type == "cpu" else copy.deepcopy(trainer.module).cpu()
    module.eval()
    config = module.config
    if kind == "autoregressive":  # the G units after each prefix, as its final figure
        nats = judge_nll(module, windows, windows[:, config.prefix_len :], config)
        return nats * units_per_byte(windows, config) / math.log(2)
    if block is None:
        return bits_per_byte(lambda _: module, config, windows)["overall"]
    return block_bits(module, config, block, windows)


def train_one(job: dict) -> dict:
    """Runs in a fresh process: build one trainer, train it, save the module, report figures."""
    torch.set_num_threads(job["threads"])
    config = ModelConfig.from_dict(job["config"])
    train_windows = Windows(job["train"], config.seq_len)
    curve_windows = Windows(job["validation"], config.seq_len).fixed(CURVE_WINDOWS, seed=7)
    train_config = TrainConfig(**{"lr": default_lr(job["kind"]), **job["train_config"]})  # each kind at its own rate
    reset_peak_rss()
    rss_before = psutil.Process().memory_info().rss
    block, device = job.get("block"), job.get("device", "cpu")
    if job["kind"] == "block":
        trainer = block_trainer(config, block, train_windows, train_config, device)
    elif job["kind"] == "end_to_end":
        trainer = end_to_end_trainer(config, train_windows, train_config, device)
    else:
        trainer = autoregressive_trainer(config, train_windows, train_config, device)
    curve = []

    def record(t: Trainer) -> None:
        if t.step_count % job["curve_every"] == 0 or t.step_count == 1:
            curve.append((t.step_count, t.compute_seconds, bits_per_byte_now(t, job["kind"], block, curve_windows)))

    steps = job.get("run_steps", train_config.steps)
    train(trainer, steps, job["name"], on_step=record)
    peak = peak_rss_bytes() - rss_before
    if job["kind"] == "block":
        save_block(Path(job["save_to"]), trainer.module, config, block, trainer.step_count)
    else:
        save_model_folder(Path(job["save_to"]), job["kind"], config, [trainer.module])
    return {
        "name": job["name"],
        "parameters": count_parameters(trainer.module),
        "peak_train_memory_mb": peak / 2**20,
        "median_step_s": statistics.median(trainer.step_seconds),
        "train_seconds": trainer.compute_seconds,
        "steps": trainer.step_count,
        "curve": curve,  # (step, training seconds, bits per byte on the curve windows)
    }


def _start_job_process(initializer: Callable[[], None] | None) -> None:
    """In a job's process: die with the benchmark that started it (Linux), then run `initializer`.

    Without this, a benchmark stopped by a signal left its job training on alone, and the
    next run shared the cores with it (seen here: a long run's swarm had one core of two).
    """
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the benchmark died before the line above
        os._exit(1)
    if initializer is not None:
        initializer()


def run_jobs(jobs: list[dict], initializer: Callable[[], None] | None = None) -> list[dict]:
    """One fresh process per job, one after the other, so they never compete for the cores;
    `initializer` runs first in each (a program's logging set-up)."""
    results = []
    start = functools.partial(_start_job_process, initializer)
    for job in jobs:
        with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"), initializer=start) as pool:
            results.append(pool.submit(train_one, job).result())
    return results
