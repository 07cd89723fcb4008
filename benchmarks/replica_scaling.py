r"""Replica scaling: what a second, fourth or eighth replica of a block buys, in steps to a loss.

A volunteer joins a block to make it learn faster. This measures whether it does: for each mode
of --modes and each replica count R of --replicas, R replicas of block --block of the small model
of benchmarks/sync.py (sync_gap.py's `replicas`: the same start weights, each replica's batches of
--batch-size drawn as a peer's are, so R replicas see R times the windows a step) train in one
process, in lockstep, with no network, and the benchmark counts the steps they take to a fixed
target loss. Steps, not seconds: the replicas share this machine's cores, so its wall time would
say how many cores it has, not what a replica buys. The modes:
- dense: each step, the replicas' gradients averaged exactly (sync_gap.py's `dense_step`, what
  hivemind's all-reduce gives every replica), then each replica's AdamW step;
- demo, outer: the peers' own strategies at the defaults of DeMoConfig and OuterConfig, built as a
  peer builds them (swarm/sync/modes.py), each replica in a thread of its own and the payloads
  passed in this process (sync_gap.py's `strategies` and `lockstep`).
The target is the validation loss one dense replica (plain AdamW) reaches after --target-steps
steps. Every --eval-every steps replica 0 is scored on sync.py's validation windows (for outer,
a multiple of H = 30 is a round's end, where replica 0 holds the anchor; in between, its own
local steps); a run stops at the first score at or below the target, or at --max-steps. Each
mode's speedup at R is its steps to the target with one replica over its steps with R, beside
the ideal R; a run that never gets there is reported as not reached, its speedup below its
one replica's steps over --max-steps; where the mode's one replica never gets there, R's speedup is
above --max-steps over R's steps. Also each run's steps against dense's one replica's.
The rate is held after its warmup (--min-lr-fraction 1.0) so that step s has the same rate for
every R; below 1 it follows a cosine over --target-steps, and beyond them stays at its floor.
Prints JSON and writes replica_scaling.json and replica_scaling.png (the loss curves of each
mode, and the speedups beside the ideal) under --out.

    python benchmarks/replica_scaling.py                 # about 10 minutes on 2 cores
    python benchmarks/replica_scaling.py --modes dense --replicas 1 2 --target-steps 20 --eval-every 10
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from sync import SMALL_MODEL, validation_windows  # the model and validation windows of benchmarks/sync.py
from sync_gap import dense_step, lockstep, peer_ids, positive, replicas, strategies  # replicas in lockstep
from tqdm import tqdm

from swarm.cli.console import setup_logging
from swarm.files import write_atomic, write_picture
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import block_denoise_ce
from swarm.model.train import Trainer
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.pseudo_gradient import OuterConfig
from swarm.sync.strategy import SyncStrategy

logger = logging.getLogger("benchmarks.replica_scaling")

MODES = ("dense", "outer", "demo")  # demo last: its runs of 8 replicas cost the most (each decodes every payload)


@dataclass(frozen=True)
class Setting:
    """What every run shares: the model, its batches and validation windows, and the options."""

    config: ModelConfig
    windows: Windows
    validation: torch.Tensor
    args: argparse.Namespace


def advance(trainers: list[Trainer], syncs: list[SyncStrategy] | None, steps: int, bar: tqdm) -> None:
    """`steps` steps of every replica: dense's exact mean of the gradients, or the mode's strategies."""
    if syncs is not None:
        lockstep(trainers, syncs, steps, bar)
        return
    for _ in range(steps):
        dense_step(trainers)
        bar.update(1)


def run(mode: str, count: int, setting: Setting, cap: int, target: float | None) -> dict:
    """`count` replicas of `mode` from the start weights, scored every --eval-every steps, until a
    score is at or below `target` (None: until `cap`); the curve and the first step that got there."""
    args = setting.args
    group = argparse.Namespace(replicas=count, block=args.block, batch_size=args.batch_size)
    trainers = replicas(setting.config, group, setting.windows, args.target_steps, min_lr_fraction=args.min_lr_fraction)
    syncs = None if mode == "dense" else strategies(mode, trainers, peer_ids(group), DeMoConfig(), OuterConfig())
    curve = []
    with tqdm(total=cap, desc=f"{mode}, R = {count}", unit="step", mininterval=5.0) as bar:
        for step in range(args.eval_every, cap + 1, args.eval_every):
            advance(trainers, syncs, args.eval_every, bar)
            loss = block_denoise_ce(trainers[0].module, setting.config, args.block, setting.validation)
            curve.append({"step": step, "validation_loss": round(loss, 4)})
            if target is not None and loss <= target:
                break
    reached = next((p["step"] for p in curve if target is not None and p["validation_loss"] <= target), None)
    if target is not None:
        logger.info("%s, R = %d: %s", mode, count, f"the target at step {reached}" if reached else "not reached")
    return {"replicas": count, "steps_to_target": reached, "last_step": curve[-1]["step"], "curve": curve}


def speedups(runs: list[dict], dense_one: int, cap: int) -> list[dict]:
    """Each run's speedup over the mode's one replica, beside the ideal R. Where only one of the two
    reached the target in `cap` steps, the bound the speedup is past: below the one replica's steps
    over `cap` where R replicas did not reach it, above `cap` over R's steps where one replica did not."""
    one = next((r["steps_to_target"] for r in runs if r["replicas"] == 1), None)
    rows = []
    for r in runs:
        steps, count = r["steps_to_target"], r["replicas"]
        rows.append({
            "replicas": count, "ideal": count, "steps_to_target": steps, "reached": steps is not None,
            "speedup": round(one / steps, 3) if one and steps else None,
            "speedup_below": round(one / cap, 3) if one and steps is None else None,
            "speedup_above": round(cap / steps, 3) if steps and not one else None,
            "over_dense_one_replica": round(dense_one / steps, 3) if steps else None,
        })  # fmt: skip
    return rows


def measure(setting: Setting, save: Callable[[dict], None]) -> None:
    """The target from dense's one replica, then every mode at every replica count; `save` gets what
    is measured so far after each mode (a run cut short keeps the modes it finished)."""
    args = setting.args
    first = run("dense", 1, setting, args.target_steps, None)
    target = first["curve"][-1]["validation_loss"]
    first["steps_to_target"] = next(p["step"] for p in first["curve"] if p["validation_loss"] <= target)
    logger.info("target: %.4f, dense's one replica after %d steps", target, args.target_steps)
    modes = {}
    for mode in args.modes:
        runs = [first if (mode, r) == ("dense", 1) else run(mode, r, setting, args.max_steps, target)
                for r in args.replicas]  # fmt: skip
        modes[mode] = {"runs": runs, "speedups": speedups(runs, first["steps_to_target"], args.max_steps)}
        save({"target": {"mode": "dense", "replicas": 1, "steps": args.target_steps, "validation_loss": target},
              "modes": modes})  # fmt: skip


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result["modes"]
    fig, panels = plt.subplots(1, len(modes) + 1, figsize=(4.5 * (len(modes) + 1), 4))
    target = result["target"]["validation_loss"]
    for panel, (mode, m) in zip(panels, modes.items()):
        for i, r in enumerate(m["runs"]):
            curve = r["curve"]
            panel.plot([p["step"] for p in curve], [p["validation_loss"] for p in curve], "-", color=f"C{i}",
                       label=f"R = {r['replicas']}")  # fmt: skip
        panel.axhline(target, linestyle="--", color="grey", label="target")
        panel.set(xlabel="step", ylabel="validation denoise CE", title=mode)
        panel.legend()
    scaling = panels[-1]
    counts = sorted({row["replicas"] for m in modes.values() for row in m["speedups"]})
    scaling.plot(counts, counts, "--", color="grey", label="ideal")
    for i, (mode, m) in enumerate(modes.items()):
        rows = [row for row in m["speedups"] if row["speedup"] is not None]
        scaling.plot([row["replicas"] for row in rows], [row["speedup"] for row in rows], "o-", color=f"C{i}",
                     label=mode)  # fmt: skip
    scaling.set(xlabel="replicas R", ylabel="steps(1) / steps(R)", title="speedup to the target", xscale="log",
                yscale="log")  # fmt: skip
    scaling.legend()
    fig.tight_layout()
    write_picture(path, fig, dpi=100)


def parsed() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--replicas", type=positive, nargs="+", default=[1, 2, 4, 8], help="replica counts R")
    parser.add_argument("--target-steps", type=positive, default=300,
                        help="the target is dense's one replica's loss after these steps")  # fmt: skip
    parser.add_argument("--max-steps", type=positive, help="the most steps a run takes (default: 2x --target-steps)")
    parser.add_argument("--batch-size", type=positive, default=16, help="per replica")
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--eval-every", type=positive, default=10, help="steps between validation scores")
    parser.add_argument("--min-lr-fraction", type=float, default=1.0,
                        help="the rate's floor over its peak (1.0: held after warmup)")  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results/replica_scaling")
    args = parser.parse_args()
    args.max_steps = args.max_steps or 2 * args.target_steps
    args.replicas = sorted(set(args.replicas))
    if 1 not in args.replicas:
        parser.error("--replicas must include 1: every speedup is over one replica")
    if args.target_steps % args.eval_every or args.max_steps % args.eval_every:
        parser.error("--target-steps and --max-steps must be multiples of --eval-every")
    return args


def main() -> None:
    args = parsed()
    setup_logging()
    torch.set_num_threads(2)
    config = ModelConfig(**SMALL_MODEL)
    setting = Setting(config, load_corpus(None).windows("train", config), validation_windows(config), args)
    settings = {**vars(args), "demo": vars(DeMoConfig()), "outer": vars(OuterConfig()), "model": config.to_dict()}
    out, result = Path(args.out), {}

    def save(measured: dict) -> None:
        result.update(config=settings, **measured)
        plot(result, out / "replica_scaling.png")
        write_atomic(out / "replica_scaling.json", json.dumps(result, indent=2).encode())

    measure(setting, save)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
