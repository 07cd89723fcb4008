"""A compressed sync mode's validation loss against dense at equal steps, as the run grows longer.

benchmarks/sync.py and time_to_loss.py measure the modes over real peers in the emulated
regions, which takes an hour for 600 steps on this machine. This runs the same replicas in one
process, with no network, for each --steps length, so that a mode's learning can be studied in
minutes (issue 47 found DeMo's sign step stalling here first):
- dense: each step, the replicas' gradients averaged (what hivemind's all-reduce gives every
  replica), then each replica's AdamW step;
- --mode outer: the peers' own `--sync outer` strategy (`OuterSync`: each replica's AdamW
  steps, and every H steps its payload exchanged and the outer step taken on the set);
- --mode demo: the peers' own `--sync demo` strategy (`DeMoSync`: every step each replica's
  payload exchanged and the DeMo step taken on the set);
- --mode demo-overlap: the peers' own `--sync demo-overlap` strategy (`DeMoOverlapSync`: each
  step's set applied a step late, the replica's own update taken ahead meanwhile), and what is
  still in flight applied at the end, as a peer does before it saves;
each replica in a thread of its own, its strategy built as a peer builds it (swarm/sync/modes.py),
the payloads passed in this process (swarm/sync/in_process.py) instead of over P2P.
Replicas are `replica_trainer`s of block --block of the small model of benchmarks/sync.py,
batches drawn from streams named as peers' are; each length is a fresh run with its own cosine
schedule, scored on sync.py's validation windows. Prints JSON and writes <mode>_gap.json and
<mode>_gap.png under --out (default benchmarks/results/<mode>_gap): loss of each, the ratio,
and the payload bytes per replica per step (one copy).

    python benchmarks/sync_gap.py                        # outer: 300, 900 and 1,500 steps, about 25 minutes
    python benchmarks/sync_gap.py --steps 300 --outer-lr 1.5
    python benchmarks/sync_gap.py --steps 600 --batch-size 32 --outer-top-k 128 --outer-error-decay 0.5
    python benchmarks/sync_gap.py --mode demo --steps 600 --batch-size 32
    python benchmarks/sync_gap.py --mode demo-overlap --steps 600 --batch-size 32
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
from swarm.peer.replica import replica_trainer
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.exchange import Exchange
from swarm.sync.in_process import LocalBoard
from swarm.sync.modes import MODES, SyncInputs
from swarm.sync.pseudo_gradient import OuterConfig
from swarm.sync.strategy import SyncStrategy, train_step

logger = logging.getLogger("benchmarks.sync_gap")

GATHER_DEADLINE_S = 120.0  # how long replicas wait for each other at a round's end (threads sharing the cores)


def peer_ids(args: argparse.Namespace) -> list[str]:
    return [f"replica{i}" for i in range(args.replicas)]


def replicas(
    config: ModelConfig, args: argparse.Namespace, windows: Windows, steps: int, **schedule: float
) -> list[Trainer]:
    """--replicas replicas of block --block from the same start weights, each drawing its own batches of
    --batch-size; `steps` is the schedule's length, `schedule` any other TrainConfig setting."""
    train = TrainConfig(steps=steps, batch_size=args.batch_size, **schedule)
    return [replica_trainer(config, args.block, windows, train, peer_id) for peer_id in peer_ids(args)]


def dense(trainers: list[Trainer], steps: int, what: str) -> None:
    """`steps` dense steps (`dense_step`), with a progress bar."""
    for _ in tqdm(range(steps), desc=what, unit="step", mininterval=5.0):
        dense_step(trainers)


def dense_step(trainers: list[Trainer]) -> None:
    """One step: each replica's gradient, their mean into every replica, each one's AdamW step."""
    open_steps = [trainer.compute_gradients() for trainer in trainers]
    with torch.no_grad():
        for params in zip(*(trainable(t.module) for t in trainers)):  # as DenseSync averages them
            mean = torch.stack([p.grad if p.grad is not None else torch.zeros_like(p) for p in params]).mean(dim=0)
            for p in params:
                p.grad.copy_(mean)
    for trainer, open_step in zip(trainers, open_steps):
        trainer.optimizer_step()
        trainer.end_step(open_step)


def strategies(
    mode: str, trainers: list[Trainer], ids: list[str], de_mo: DeMoConfig, outer: OuterConfig
) -> list[SyncStrategy]:
    """The peer's strategy of `mode` for each replica, built as the peer builds it (swarm/sync/modes.py),
    each replica's exchange passing payloads in this process (a `LocalBoard`) to all the others."""
    board = LocalBoard(GATHER_DEADLINE_S)
    syncs = []
    for trainer, own in zip(trainers, ids):
        exchange = Exchange(board.transport(own), own, lambda own=own: [p for p in ids if p != own])
        given = SyncInputs(trainer.module, trainer.config.lr, de_mo, outer, overlap_steps=1,
                           timeout=GATHER_DEADLINE_S, exchange=exchange)  # fmt: skip
        syncs.append(MODES[mode].build(given))
    return syncs


def lockstep(trainers: list[Trainer], syncs: list[SyncStrategy], steps: int, bar: tqdm, settle: bool = False) -> None:
    """`steps` training steps of every replica with its strategy, each replica in a thread of its own
    (a strategy's update waits for the others' payloads of its step, so they go in step); `bar`
    counts replica 0's steps. With `settle`, what is still in flight is applied at the end, as a
    peer does before it saves."""

    def run(index: int) -> None:
        for _ in range(steps):
            train_step(trainers[index], syncs[index])
            bar.update(int(index == 0))
        if settle:
            syncs[index].settle(trainers[index])

    with ThreadPoolExecutor(len(trainers)) as pool:
        for running in [pool.submit(run, index) for index in range(len(trainers))]:
            running.result()


OUTER_OPTIONS = ("outer_lr", "outer_top_k", "outer_error_decay")  # OuterConfig's settings this takes
DEMO_OPTIONS = ("momentum_decay",)


def outer_settings(args: argparse.Namespace) -> OuterConfig:
    return OuterConfig(outer_lr=args.outer_lr, top_k=args.outer_top_k, error_decay=args.outer_error_decay).checked()


def demo_settings(args: argparse.Namespace) -> DeMoConfig:
    return DeMoConfig(momentum_decay=args.momentum_decay)


def compressed(trainers: list[Trainer], ids: list[str], steps: int, args: argparse.Namespace, what: str) -> float:
    """The strategy of --mode on every replica, each in a thread of its own, the payloads passed
    in this process; the payload bytes per step of one replica (replica 0's, one copy)."""
    syncs = strategies(args.mode, trainers, ids, demo_settings(args), outer_settings(args))
    with tqdm(total=steps, desc=what, unit="step", mininterval=5.0) as bar:
        lockstep(trainers, syncs, steps, bar, settle=True)
    return syncs[0].bytes_sent / (len(trainers) - 1) / steps


def plot(rows: list[dict], mode: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (losses, ratios) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["steps"] for r in rows]
    losses.plot(steps, [r["dense_loss"] for r in rows], "o-", label="dense")
    losses.plot(steps, [r[f"{mode}_loss"] for r in rows], "o-", label=mode)
    losses.set(xlabel="steps", ylabel="validation denoise CE", title="loss at equal steps")
    losses.legend()
    ratios.plot(steps, [r[f"{mode}_over_dense"] for r in rows], "o-")
    ratios.axhline(LOSS_RATIO_TARGET, linestyle="--", color="grey", label=f"target {LOSS_RATIO_TARGET}")
    ratios.set(xlabel="steps", ylabel=f"{mode} / dense", title="the gap")
    ratios.legend()
    fig.tight_layout()
    write_picture(path, fig, dpi=100)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive whole number")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["outer", "demo", "demo-overlap"], default="outer",
                        help="the compressed mode against dense")
    parser.add_argument(
        "--steps", type=positive, nargs="+", default=[300, 900, 1500], help="run lengths (outer: multiples of H)"
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--outer-lr", type=float, default=OuterConfig.outer_lr)
    parser.add_argument("--outer-top-k", type=positive, default=OuterConfig.top_k, help="per 64 x 64 tile")
    parser.add_argument("--outer-error-decay", type=fraction, default=OuterConfig.error_decay,
                        help="the error buffer's share kept each round")
    parser.add_argument("--momentum-decay", type=float, default=DeMoConfig.momentum_decay, help="demo's")
    parser.add_argument("--out", help="default: benchmarks/results/<mode>_gap")
    args = parser.parse_args()
    setup_logging()
    if args.mode == "outer" and any(s % outer_settings(args).steps for s in args.steps):
        parser.error(f"every --steps must be a multiple of H ({outer_settings(args).steps})")
    torch.set_num_threads(2)
    config = ModelConfig(**SMALL_MODEL)
    corpus = load_corpus(None)
    windows = corpus.windows("train", config)
    validation = corpus.windows("validation", config).fixed(VALIDATION_WINDOWS)
    mode, rows = args.mode, []
    for steps in args.steps:
        trainers = replicas(config, args, windows, steps)
        dense(trainers, steps, f"dense, {steps} steps")
        dense_loss = block_denoise_ce(trainers[0].module, config, args.block, validation)
        trainers = replicas(config, args, windows, steps)
        per_step = compressed(trainers, peer_ids(args), steps, args, f"{mode}, {steps} steps")
        loss = block_denoise_ce(trainers[0].module, config, args.block, validation)
        rows.append({"steps": steps, "dense_loss": dense_loss, f"{mode}_loss": loss,
                     f"{mode}_over_dense": loss / dense_loss, f"{mode}_payload_bytes_per_step": per_step})  # fmt: skip
        logger.info("%d steps: dense %.4f, %s %.4f (%.3fx)", steps, dense_loss, mode, loss, loss / dense_loss)
    out = Path(args.out or f"benchmarks/results/{mode}_gap")
    out.mkdir(parents=True, exist_ok=True)
    other_mode_options = DEMO_OPTIONS if mode == "outer" else OUTER_OPTIONS
    options = {k: v for k, v in vars(args).items() if k not in other_mode_options}
    settings = {"outer": vars(outer_settings(args))} if mode == "outer" else {"demo": vars(demo_settings(args))}
    result = {"config": {**options, **settings, "model": config.to_dict()}, "runs": rows}
    plot(rows, mode, out / f"{mode}_gap.png")
    write_atomic(out / f"{mode}_gap.json", json.dumps(result, indent=2).encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
