"""Quality, memory and speed: the block model against its two baselines, at equal compute.

Trains, each in its own process (so peak memory is that trainer's alone):
- every block of the block model, each for --steps steps (a block costs 1/B of the
  end-to-end model, so B blocks at N steps each equal the end-to-end model at N steps);
- the end-to-end denoiser for --steps steps;
- the autoregressive byte transformer (about the same parameter count) for --steps steps.
Then evaluates all three on the same validation windows, sigmas and noise, and prints one
JSON object (the loss curves only go to the file). Writes quality.json and a PNG of the
validation loss curves under --out.

    python benchmarks/quality.py --steps 300      # about 10 minutes per model on 2 cores
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

import psutil
import torch

from swarm.cli.console import setup_logging
from swarm.model.autoregressive import ByteTransformer, generate_bytes
from swarm.model.checkpoint import load_block, load_model_folder, save_block, save_model_folder
from swarm.model.data import ByteWindows, load_corpus
from swarm.model.denoiser import ModelConfig, count_parameters
from swarm.model.diffusion import generate_span, local_runner
from swarm.model.evaluate import evaluate_autoregressive, evaluate_denoiser
from swarm.model.train import TrainConfig, Trainer, autoregressive_trainer, block_trainer, end_to_end_trainer, train

logger = logging.getLogger("benchmarks.quality")

CURVE_WINDOWS = 64


def reset_peak_rss() -> None:
    """Reset the kernel's high-water mark of this process's RSS (Linux), so the peak is the trainer's."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def validation_curve(windows: torch.Tensor, every: int) -> tuple[list, Callable[[Trainer], None]]:
    """An on_step hook that records the trainer's own loss on fixed validation windows and noise."""
    curve = []

    def record(t: Trainer) -> None:
        if t.step_count % every and t.step_count != 1:
            return
        t.module.eval()
        with torch.no_grad():
            loss = t.loss_fn(windows, torch.Generator().manual_seed(99)).item()
        curve.append((t.step_count, loss))

    return curve, record


def train_one(job: dict) -> dict:
    """Runs in a fresh process: build one trainer, train it, save the module, report figures."""
    setup_logging()
    torch.set_num_threads(job["threads"])
    config = ModelConfig.from_dict(job["config"])
    train_windows = ByteWindows(job["train"], config.seq_len)
    curve_windows = ByteWindows(job["validation"], config.seq_len).fixed(CURVE_WINDOWS, seed=7)
    train_config = TrainConfig(**job["train_config"])
    reset_peak_rss()
    rss_before = psutil.Process().memory_info().rss
    if job["kind"] == "block":
        trainer = block_trainer(config, job["block"], train_windows, train_config)
    elif job["kind"] == "end_to_end":
        trainer = end_to_end_trainer(config, train_windows, train_config)
    else:
        trainer = autoregressive_trainer(config, train_windows, train_config)
    curve, record = validation_curve(curve_windows, job["curve_every"])
    train(trainer, train_config.steps, job["name"], on_step=record)
    peak = peak_rss_bytes() - rss_before
    if job["kind"] == "block":
        save_block(Path(job["save_to"]), trainer.module, config, job["block"], trainer.step_count)
    else:
        save_model_folder(Path(job["save_to"]), job["kind"], config, [trainer.module])
    return {
        "name": job["name"],
        "parameters": count_parameters(trainer.module),
        "peak_train_memory_mb": peak / 2**20,
        "median_step_s": statistics.median(trainer.step_seconds),
        "curve": curve,
    }


def run_jobs(jobs: list[dict]) -> list[dict]:
    """One fresh process per job, one after the other, so they never compete for the cores."""
    results = []
    for job in jobs:
        with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
            results.append(pool.submit(train_one, job).result())
    return results


def make_jobs(config: ModelConfig, corpus, args, workdir: Path) -> list[dict]:
    common = {
        "config": config.to_dict(),
        "train": corpus.train,
        "validation": corpus.validation,
        "train_config": {"steps": args.steps, "batch_size": args.batch_size, "seed": 0},
        "threads": args.threads,
        "curve_every": max(1, args.steps // 12),
    }
    jobs = [
        {**common, "kind": "block", "block": b, "name": f"block {b}", "save_to": str(workdir / f"block{b}")}
        for b in range(config.n_blocks)
    ]
    jobs.append({**common, "kind": "end_to_end", "name": "end-to-end", "save_to": str(workdir / "e2e")})
    jobs.append({**common, "kind": "autoregressive", "name": "autoregressive", "save_to": str(workdir / "ar")})
    return jobs


def samples(config: ModelConfig, windows: torch.Tensor, blocks, e2e, judge, steps_per_block: int) -> dict:
    """Three continuations from each model after the same three validation prefixes."""
    prefix = windows[:3, : config.prefix_len]
    text = lambda rows: [bytes(r.tolist()).decode("utf-8", errors="replace") for r in rows]  # noqa: E731
    out = {"prefix": text(prefix), "true": text(windows[:3, config.prefix_len :])}
    for name, model in (("blocks", blocks), ("end_to_end", e2e)):
        run_block = local_runner(model, config)
        out[name] = text(generate_span(run_block, config, prefix, steps_per_block, torch.Generator().manual_seed(0))[0])
    out["autoregressive"] = text(generate_bytes(judge, prefix, config.gen_len, torch.Generator().manual_seed(0)))
    return out


def summarize(config: ModelConfig, trained: list[dict], workdir: Path, windows: torch.Tensor, args) -> dict:
    blocks = [load_block(workdir / f"block{b}", config, b)[0].eval() for b in range(config.n_blocks)]
    e2e = load_model_folder(workdir / "e2e").modules[0]
    judge: ByteTransformer = load_model_folder(workdir / "ar").modules[0]
    block_figures = evaluate_denoiser(lambda b: blocks[b], config, windows, args.steps_per_block, judge)
    e2e_figures = evaluate_denoiser(lambda b: e2e, config, windows, args.steps_per_block, judge)
    by_name = {t["name"]: t for t in trained}
    block_train = [by_name[f"block {b}"] for b in range(config.n_blocks)]
    block_peak = max(t["peak_train_memory_mb"] for t in block_train)
    block_step = statistics.median(t["median_step_s"] for t in block_train)
    e2e_train = by_name["end-to-end"]
    return {
        "config": config.to_dict(),
        "steps_each": args.steps,
        "batch_size": args.batch_size,
        "validation_windows": len(windows),
        "steps_per_block_at_generation": args.steps_per_block,
        "parameters": {t["name"]: t["parameters"] for t in trained},
        "denoise_ce": {"blocks": block_figures["denoise_ce"], "end_to_end": e2e_figures["denoise_ce"]},
        "denoise_ce_ratio_blocks_over_end_to_end": block_figures["denoise_ce"]["overall"]
        / e2e_figures["denoise_ce"]["overall"],
        "gen_nll": {"blocks": block_figures["gen_nll"], "end_to_end": e2e_figures["gen_nll"], "true_text": block_figures["true_nll"]},
        "chain_ce": {"blocks": block_figures["chain_ce"], "end_to_end": e2e_figures["chain_ce"]},
        "ar_ce": evaluate_autoregressive(judge, config, windows)["ar_ce"],
        "samples": samples(config, windows, lambda b: blocks[b], lambda b: e2e, judge, args.steps_per_block),
        "peak_train_memory_mb": {"one_block_max": block_peak, "end_to_end": e2e_train["peak_train_memory_mb"]},
        "peak_memory_ratio_block_over_end_to_end": block_peak / e2e_train["peak_train_memory_mb"],
        "median_step_s": {"one_block": block_step, "end_to_end": e2e_train["median_step_s"]},
        "step_time_ratio_block_over_end_to_end": block_step / e2e_train["median_step_s"],
        "curves": {t["name"]: t["curve"] for t in trained},
    }


def plot_curves(result: dict, n_blocks: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = result["curves"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for b in range(n_blocks):
        steps, losses = zip(*curves[f"block {b}"])
        ax.plot(steps, losses, alpha=0.4, linestyle="--", label=f"block {b} (its own sigma interval)")
    mean = [sum(curves[f"block {b}"][i][1] for b in range(n_blocks)) / n_blocks for i in range(len(steps))]
    ax.plot(steps, mean, linewidth=2, label="blocks: mean over blocks")
    for name in ("end-to-end", "autoregressive"):
        s, l = zip(*curves[name])
        ax.plot(s, l, linewidth=2, label=name)
    ax.set_xlabel("optimizer steps (each block, and each baseline)")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title("BlockSwarm quality benchmark: validation loss at equal compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="budget: optimizer steps for each block and each baseline")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--windows", type=int, default=256, help="validation windows for the figures")
    parser.add_argument("--steps-per-block", type=int, default=4, help="Euler steps per block at generation")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--config", default=None, help="model config JSON (default: the built-in config)")
    parser.add_argument("--out", default="benchmarks/results/quality", help="folder for quality.json and quality.png")
    args = parser.parse_args()
    setup_logging()
    config = ModelConfig.from_json_file(args.config)
    corpus = load_corpus()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        trained = run_jobs(make_jobs(config, corpus, args, Path(tmp)))
        windows = ByteWindows(corpus.validation, config.seq_len).fixed(args.windows)
        result = summarize(config, trained, Path(tmp), windows, args)
    result["wall_s"] = time.time() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps(result, indent=2))
    plot_curves(result, config.n_blocks, out / "quality.png")
    printed = {k: v for k, v in result.items() if k != "curves"}  # the curves are in the file and the plot
    print(json.dumps(printed, indent=2))


if __name__ == "__main__":
    main()
