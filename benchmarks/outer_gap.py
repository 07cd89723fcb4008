"""The outer-step mode's validation loss against dense at equal steps, as the run grows longer.

benchmarks/sync.py measures the outer mode over real peers, but on this machine 4 dense peers
take about 0.3 s a step, so it stops at a few hundred steps, where error feedback has not yet
caught up with what the top-k left behind. This runs the same replicas in one process, with no
network, for each --steps length:
- dense: each step, the replicas' gradients averaged (what hivemind's all-reduce gives every
  replica), then each replica's AdamW step;
- outer: the peers' own `--sync outer` strategy (`OuterSync`: each replica's AdamW steps, and
  every H steps its payload exchanged and the outer step taken on the set, as a peer does), each
  replica in a thread of its own, the payloads passed in this process (swarm/sync/in_process.py)
  instead of over P2P.
Replicas are `replica_trainer`s of block --block of the small model of benchmarks/sync.py,
batches drawn from streams named as peers' are; each length is a fresh run with its own cosine
schedule. Prints JSON and writes outer_gap.json and outer_gap.png: loss of each, the ratio,
and the payload bytes per replica per step (one copy).

    python benchmarks/outer_gap.py                      # 300, 900 and 1,500 steps: about 25 minutes
    python benchmarks/outer_gap.py --steps 300 --outer-lr 1.5
"""

from __future__ import annotations

import argparse
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from sync import (  # the model and validation windows of benchmarks/sync.py, beside this
    LOSS_RATIO_TARGET,
    SMALL_MODEL,
    VALIDATION_WINDOWS,
)
from tqdm import tqdm

from swarm.cli.console import setup_logging
from swarm.files import write_atomic, write_picture
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import block_denoise_ce
from swarm.model.train import TrainConfig, Trainer, trainable
from swarm.peer.life import replica_trainer
from swarm.sync.exchange import Exchange
from swarm.sync.in_process import LocalBoard
from swarm.sync.outer import OuterSync
from swarm.sync.pseudo_gradient import OuterConfig, OuterOptimizer
from swarm.sync.strategy import train_step

logger = logging.getLogger("benchmarks.outer_gap")

GATHER_DEADLINE_S = 120.0  # how long replicas wait for each other at a round's end (threads sharing the cores)


def peer_ids(args: argparse.Namespace) -> list[str]:
    return [f"replica{i}" for i in range(args.replicas)]


def replicas(config: ModelConfig, args: argparse.Namespace, windows: Windows, steps: int) -> list[Trainer]:
    train = TrainConfig(steps=steps, batch_size=args.batch_size)
    return [replica_trainer(config, args.block, windows, train, peer_id) for peer_id in peer_ids(args)]


def dense(trainers: list[Trainer], steps: int, what: str) -> None:
    """Every step: each replica's gradient, their mean into every replica, each one's AdamW step."""
    for _ in tqdm(range(steps), desc=what, unit="step", mininterval=5.0):
        open_steps = [trainer.compute_gradients() for trainer in trainers]
        with torch.no_grad():
            for params in zip(*(trainable(t.module) for t in trainers)):  # as DenseSync averages them
                mean = torch.stack([p.grad if p.grad is not None else torch.zeros_like(p) for p in params]).mean(dim=0)
                for p in params:
                    p.grad.copy_(mean)
        for trainer, open_step in zip(trainers, open_steps):
            trainer.optimizer_step()
            trainer.end_step(open_step)


def outer(trainers: list[Trainer], ids: list[str], steps: int, outer_config: OuterConfig, what: str) -> float:
    """`OuterSync` on every replica, each in a thread of its own, the payloads passed in this
    process; the payload bytes per step of one replica (replica 0's, one copy)."""
    board = LocalBoard(GATHER_DEADLINE_S)
    syncs = [OuterSync(OuterOptimizer(t.module, outer_config, t.config.lr),
                       Exchange(board.transport(own), own, lambda own=own: [p for p in ids if p != own]))
             for t, own in zip(trainers, ids)]  # fmt: skip
    with tqdm(total=steps, desc=what, unit="step", mininterval=5.0) as bar:

        def run(index: int) -> None:
            for _ in range(steps):
                train_step(trainers[index], syncs[index])
                bar.update(int(index == 0))

        with ThreadPoolExecutor(len(trainers)) as pool:
            for running in [pool.submit(run, index) for index in range(len(trainers))]:
                running.result()
    return syncs[0].bytes_sent / (len(trainers) - 1) / steps


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (losses, ratios) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["steps"] for r in rows]
    losses.plot(steps, [r["dense_loss"] for r in rows], "o-", label="dense")
    losses.plot(steps, [r["outer_loss"] for r in rows], "o-", label="outer")
    losses.set(xlabel="steps", ylabel="validation denoise CE", title="loss at equal steps")
    losses.legend()
    ratios.plot(steps, [r["outer_over_dense"] for r in rows], "o-")
    ratios.axhline(LOSS_RATIO_TARGET, linestyle="--", color="grey", label=f"target {LOSS_RATIO_TARGET}")
    ratios.set(xlabel="steps", ylabel="outer / dense", title="the gap")
    ratios.legend()
    fig.tight_layout()
    write_picture(path, fig, dpi=100)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of steps")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive, nargs="+", default=[300, 900, 1500], help="run lengths (multiples of H)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--outer-lr", type=float, default=OuterConfig.outer_lr)
    parser.add_argument("--out", default="benchmarks/results/outer_gap")
    args = parser.parse_args()
    setup_logging()
    outer_config = OuterConfig(outer_lr=args.outer_lr).checked()
    if any(s % outer_config.steps for s in args.steps):
        parser.error(f"every --steps must be a multiple of H ({outer_config.steps})")
    torch.set_num_threads(2)
    config = ModelConfig(**SMALL_MODEL)
    corpus = load_corpus(None)
    windows = corpus.windows("train", config)
    validation = corpus.windows("validation", config).fixed(VALIDATION_WINDOWS)
    rows = []
    for steps in args.steps:
        trainers = replicas(config, args, windows, steps)
        dense(trainers, steps, f"dense, {steps} steps")
        dense_loss = block_denoise_ce(trainers[0].module, config, args.block, validation)
        trainers = replicas(config, args, windows, steps)
        per_step = outer(trainers, peer_ids(args), steps, outer_config, f"outer, {steps} steps")
        outer_loss = block_denoise_ce(trainers[0].module, config, args.block, validation)
        rows.append({"steps": steps, "dense_loss": dense_loss, "outer_loss": outer_loss,
                     "outer_over_dense": outer_loss / dense_loss, "outer_payload_bytes_per_step": per_step})  # fmt: skip
        logger.info("%d steps: dense %.4f, outer %.4f (%.3fx)", steps, dense_loss, outer_loss, outer_loss / dense_loss)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"config": {**vars(args), "outer": vars(outer_config), "model": config.to_dict()}, "runs": rows}
    plot(rows, out / "outer_gap.png")
    write_atomic(out / "outer_gap.json", json.dumps(result, indent=2).encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
