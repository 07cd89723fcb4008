"""Wall time across regions to the datacenter's loss: the sync headline.

Compute utilisation (benchmarks/sync.py) says how little of a replica's time is idle; it does
not say what the time bought: spare batches fill every wait, yet may teach the block little,
and a compressed mode may end far above dense's loss. This measures what a user choosing a sync
mode waits for. The target is the datacenter's: the validation loss that dense all-reduce with
no delay (TARGET_MODE, the ideal DisTrO and DeMo are measured against) reaches after --steps.
Then each mode of --modes runs --replicas replicas of one block of sync.py's small model in the
emulated regions, from the same start weights with the same batches, and its efficiency is
dense-with-no-delay's seconds to the target over the mode's seconds to it in the regions. The
regions runs go on past --steps to --regions-steps (default 1.5 times as many): their schedule
spans --steps, as the target's does, and then stays at its floor, so that a mode a little behind
dense at --steps can still be timed to the target rather than only said to miss it (the extra
steps cost it wall time, which the efficiency counts).
- regions: each replica in its own network namespace in us-east, eu-west or ap-southeast (in
  turn), with the one-way delays and link caps of benchmarks/regions.yaml: sync.py's regions
  runs, placed exactly as they are (`region_lab`);
- no-delay (the target run only): the same namespaces and the same delay line
  (swarm/lab/delayd.py), but every delay 0 and no caps. The same lab rather than 127.0.0.1, so
  that everything else is the same: the delay line carries (and costs the CPU of) every packet in
  both placements, and the processes, the namespaces and the addresses do not change; only the
  internet's delays and caps do.
Every run takes --region-batch-size windows a step, sync.py's batch for the
regions (a step about as long as a round trip between regions). A replica's batches are drawn
from a stream seeded by its peer id, so every replica keeps one libp2p identity file for the
whole benchmark (`swarm-peer --identity`, as benchmarks/attacks.py part 3 does): replica r<i>
draws the same batches in every run of every mode (in the -spare modes, as far as the runs take
as many spare batches: each spare batch draws from the same stream).

The peers save every --save-every steps (outer modes: the next multiple of their outer round H,
the only steps where their replicas agree; the peer refuses others). The benchmark keeps every
checkpoint as it appears (a peer keeps only its newest two) and afterwards scores each on
sync.py's fixed validation windows and noise (`validation_windows`, `block_denoise_ce`). Each
save's time comes from the peers' own logs: the line a peer logs as its first step starts
("training from step 0") and the line it logs once a checkpoint is written ("saved step N"),
both stamped with the wall clock to the millisecond by the same process. The log is used
rather than the sync trace, which dense (no payload exchange) does not write, and rather than
the checkpoint file's time, which has no first step to be measured from. A run's clock starts at
its first replica's first step (joining the swarm is not counted; how much later each other
replica began is recorded, `first_step_seconds`); a step's point is the replicas' mean
validation loss, at the moment the last replica had saved it (the swarm holds that mean loss
only then), and the start weights' loss at 0 s.

Efficiency of a mode = the target run's seconds to the target / the mode's regions run's
seconds to it, each the first time its curve reaches it, linear between saves (1.0: the
internet and the compression cost nothing). "Reaches" allows REACHED_WITHIN (0.01%) of float
rounding: dense computes the same weights in both placements, and they ended 0.0005% apart. A
regions run that never reaches the target has no efficiency: the JSON says "not reached" and
gives its final loss over the target instead. Each mode's final loss, its loss at --steps (equal
steps with the target) and its bytes per replica per step stand beside it; utilisation (and the rest of
sync.py's figures of each run) is kept as a diagnostic. The summary names the best compressed mode and
whether its efficiency is at least EFFICIENCY_TARGET. The default modes are the ones a user chooses between:
dense, DeMo's default mode, its best overlapped variant and the best outer variant of the 150-step runs before.

Modes: dense has no spare variant: spare batches fill the wait for the other replicas'
payloads, and dense exchanges none (hivemind's all-reduce; the peer refuses --spare-batch-size
without a payload exchange). Every payload mode takes them: demo-spare, demo-overlap-spare and
outer-overlap-spare are the same modes with a spare batch of an eighth of the batch computed
instead of each wait (sync.py's -spare modes).

Needs root, iptables and NetfilterQueue (swarm/lab/netlab.py). Writes time_to_loss.json and
time_to_loss.png under --out. At the defaults (the target run of 600 steps, 4 modes of 900 in
the regions) the run is estimated at about 100 minutes on 2 cores, 45 of them dense in the
regions (an estimate from the runs before: steps of 1.5 s for dense with no delay, about 3 s for
dense in the regions and 0.9 s for DeMo there, and 20-40 s of start, stop and scoring a run).

    python benchmarks/time_to_loss.py
    python benchmarks/time_to_loss.py --modes demo-overlap-spare --steps 30 --save-every 10 --out /tmp/ttl
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from sync import MODES, model_path, region_facts, region_lab, run_mode, validation_windows

from swarm.cli.console import setup_logging
from swarm.errors import SwarmError
from swarm.files import write_atomic, write_picture
from swarm.lab import netlab
from swarm.model.checkpoint import load_block
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import block_denoise_ce
from swarm.model.train import TrainConfig, block_trainer
from swarm.sync.modes import MODES as PEER_MODES
from swarm.sync.pseudo_gradient import OuterConfig

logger = logging.getLogger("benchmarks.time_to_loss")

DEFAULT_MODES = ["dense", "demo", "demo-overlap-spare", "outer-overlap-spare"]
TARGET_MODE = "dense"  # with no delay: the datacenter, whose loss every mode is timed to
EFFICIENCY_TARGET = 0.9
# a loss this close to the target (relative) reaches it: two runs of the same weights differ by float
# rounding (dense, whose all-reduce sums in another order: 0.0005% apart after the same 30 steps)
REACHED_WITHIN = 1e-4
LAB_PREFIX = "bswttl"  # its own namespaces: a lab tears down whatever an earlier lab of its prefix left
ROOT = Path(__file__).resolve().parent.parent
KEEP_POLL_S = 0.5  # a peer deletes an old checkpoint only once it is older than its records may live (30 s and more)
CHECKPOINT = re.compile(r"^block_\d+_step_(\d+)\.safetensors$")
LOG_STAMP = "%Y-%m-%d %H:%M:%S,%f"  # swarm.cli.console.setup_logging's %(asctime)s
# the peer's log lines a run is timed by (swarm/peer/training.py and served.py write them)
STARTED = re.compile(r"^(\S+ \S+) INFO swarm\.peer\.\w+: block \d+: training from step \d+")
SAVED = re.compile(r"^(\S+ \S+) INFO swarm\.peer\.\w+: block \d+: saved step (\d+) ")


# ---- reading a run ----------------------------------------------------------------------------------


def log_times(log: str) -> tuple[float | None, dict[int, float]]:
    """A peer's log: the wall time its first step started (None: it never trained) and each save's."""
    started, saved = None, {}
    for line in log.splitlines():
        if started is None and (found := STARTED.match(line)):
            started = datetime.strptime(found[1], LOG_STAMP).timestamp()
        elif found := SAVED.match(line):
            saved.setdefault(int(found[2]), datetime.strptime(found[1], LOG_STAMP).timestamp())
    return started, saved


@contextlib.contextmanager
def kept_checkpoints(workdir: Path, names: list[str], into: Path) -> Iterator[None]:
    """While the block runs, hard-link every checkpoint replica `name` saves (in `workdir/name/`)
    into `into/name/`: a peer keeps only its newest two (swarm/checkpoints/store.py), and every
    save is scored afterwards. A checkpoint appears under its name whole (written, then renamed)."""
    stop = threading.Event()

    def keep() -> None:
        for name in names:
            for path in (workdir / name).glob("block_*_step_*.safetensors"):
                target = into / name / path.name
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile: found missing when scored
                        os.link(path, target)

    def watch() -> None:
        while not stop.wait(KEEP_POLL_S):
            keep()

    thread = threading.Thread(target=watch, name="keep-checkpoints", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        keep()  # the last saves, made after the last poll


def scores(folder: Path, config: ModelConfig, block: int, windows) -> dict[int, float]:
    """Validation loss of every checkpoint in `folder`, by step."""
    found = {int(m[1]): path for path in folder.glob("*.safetensors") if (m := CHECKPOINT.match(path.name))}
    return {step: block_denoise_ce(load_block(found[step], config, block)[0], config, block, windows)
            for step in sorted(found)}  # fmt: skip


def loss_curve(
    starts: dict[str, float], saves: dict[str, dict[int, float]], losses: dict[str, dict[int, float]], start_loss: float
) -> list[dict]:
    """The run's validation loss over wall time, in seconds since its first replica's first step:
    the start weights' loss at 0 s, then for each step every replica saved and was scored on, the
    replicas' mean loss at the moment the last of them had saved it."""
    t0 = min(starts.values())
    steps = set.intersection(*(set(saves[name]) & set(losses[name]) for name in starts))
    curve = [{"step": 0, "seconds": 0.0, "validation_loss": start_loss}]
    for step in sorted(steps):
        at = {name: saves[name][step] - t0 for name in starts}
        loss = {name: losses[name][step] for name in starts}
        curve.append({"step": step, "seconds": max(at.values()), "validation_loss": statistics.mean(loss.values()),
                      "seconds_per_replica": at, "validation_loss_per_replica": loss})  # fmt: skip
    return curve


# ---- the figure -------------------------------------------------------------------------------------


def time_to(curve: list[dict], target: float) -> float | None:
    """Seconds until `curve` first reaches `target` (linear between its points); None if it never does."""
    before = None
    for point in curve:
        seconds, loss = point["seconds"], point["validation_loss"]
        if loss <= target:
            if before is None:
                return seconds
            was_s, was_loss = before  # was_loss > target >= loss
            return was_s + (was_loss - target) / (was_loss - loss) * (seconds - was_s)
        before = seconds, loss
    return None


def efficiency(no_delay: list[dict], regions: list[dict]) -> dict:
    """The no-delay (target) run's seconds to its final validation loss over the regions run's
    seconds to it (within REACHED_WITHIN, for both), and the regions run's final loss and its
    loss at the target run's last step (equal steps)."""
    target = no_delay[-1]["validation_loss"]
    within = target * (1 + REACHED_WITHIN)
    base, took = time_to(no_delay, within), time_to(regions, within)
    return {
        "target_loss": target,
        "no_delay_seconds": base,
        "regions_seconds": took,
        "reached": took is not None,
        "efficiency": base / took if took else None,  # 0 s: the target is the start loss, nothing was learned
        "final_loss": regions[-1]["validation_loss"],
        "final_loss_over_target": regions[-1]["validation_loss"] / target,
        "loss_at_target_steps": next((p["validation_loss"] for p in regions
                                      if p.get("step") == no_delay[-1].get("step")), None),
    }


def summary(modes: dict[str, dict]) -> dict:
    """The best compressed mode (highest efficiency: every mode but TARGET_MODE) and whether it
    meets the target; every mode's efficiency, the modes whose regions run never reached the
    target, and those whose runs failed."""
    every = {mode: m.get("efficiency") for mode, m in modes.items()}
    measured = {mode: e for mode, e in every.items() if e is not None and mode != TARGET_MODE}
    best = max(measured, key=measured.get) if measured else None
    return {
        "efficiency": every,
        "not_reached": [mode for mode, m in modes.items() if m.get("reached") is False],
        "failed": [mode for mode, m in modes.items() if "error" in m],
        "best_mode": best,
        "best_efficiency": measured.get(best),
        "target": EFFICIENCY_TARGET,
        "met": best is not None and measured[best] >= EFFICIENCY_TARGET,
    }


def save_every(mode: str, every: int) -> int:
    """The peers' --save-every in `mode`: `every`, or for outer modes the next multiple of their round H."""
    peer_mode = MODES[mode][MODES[mode].index("--sync") + 1]
    if not PEER_MODES[peer_mode].outer_rounds:
        return every
    rounds = OuterConfig().steps
    return math.ceil(every / rounds) * rounds


# ---- the runs ---------------------------------------------------------------------------------------


def run_placement(
    args,
    mode: str,
    placement: str,
    workdir: Path,
    lab_regions: tuple[dict, Callable[[str, str], float]],
    start_loss: float,
    steps: int,
) -> dict:
    """One run of `mode` in `placement`, `steps` long on a schedule of --steps: sync.py's figures
    of it and its validation loss over wall time."""
    regions, one_way_s = lab_regions if placement == "regions" else (None, lambda a, b: 0.0)
    names = [f"r{r}" for r in range(args.replicas)]
    every = save_every(mode, args.save_every)
    with (
        region_lab(args.replicas, regions, one_way_s, LAB_PREFIX) as lab,
        kept_checkpoints(workdir, names, workdir / "kept"),
    ):
        run = run_mode(args, mode, args.replicas, steps, workdir, lab, placement, every, args.identities, args.steps)
    logger.info("%s, %s: scoring every replica's checkpoints", mode, placement)
    times = {name: log_times((workdir / "logs" / f"{name}.log").read_text(errors="replace")) for name in names}
    starts = {name: started for name, (started, _) in times.items()}
    if missing := [name for name, started in starts.items() if started is None]:
        raise SwarmError(f"no 'training from step' line in the logs of {', '.join(missing)}")
    losses = {name: scores(workdir / "kept" / name, args.config, args.block, args.windows) for name in names}
    curve = loss_curve(starts, {name: saved for name, (_, saved) in times.items()}, losses, start_loss)
    if curve[-1]["step"] != steps:
        raise SwarmError(f"the replicas' step-{steps} checkpoints were not all kept")
    run.pop("curve")  # the training losses the records announced: the validation curve stands for them
    return {"save_every": every, "curve": curve, "wall_seconds": curve[-1]["seconds"],
            "first_step_seconds": {name: started - min(starts.values()) for name, started in starts.items()},
            "run": run}  # fmt: skip


def run_all(args, workdir: Path) -> dict:
    """The target run (TARGET_MODE with no delay), then every mode in the regions; each mode's
    efficiency against the target. A mode whose run fails is recorded with its error, and the
    others still run; without the target there is no figure (SwarmError)."""
    regions, one_way_s = netlab.load_regions(Path(args.regions))
    train_windows = load_corpus(None).windows("train", args.config)
    start = block_trainer(args.config, args.block, train_windows, TrainConfig()).module  # every replica's start weights
    start_loss = block_denoise_ce(start, args.config, args.block, args.windows)
    total = len(args.modes) + 1
    logger.info("run 1 of %d: the target, %s with no delay, %d replicas, %d steps", total, TARGET_MODE, args.replicas,
                args.steps)  # fmt: skip
    target = run_placement(args, TARGET_MODE, "no-delay", workdir / "target", (regions, one_way_s), start_loss,
                           args.steps)  # fmt: skip
    modes = {}
    for i, mode in enumerate(args.modes):
        logger.info("run %d of %d: %s in the regions, %d replicas, %d steps", i + 2, total, mode, args.replicas,
                    args.regions_steps)  # fmt: skip
        try:
            run = run_placement(args, mode, "regions", workdir / mode, (regions, one_way_s), start_loss,
                                args.regions_steps)  # fmt: skip
        except SwarmError as error:
            logger.error("%s: %s", mode, error)
            modes[mode] = {"error": str(error).replace(str(workdir), "<tmp>")}
            continue
        modes[mode] = {"runs": {"regions": run}, **efficiency(target["curve"], run["curve"]),
                       "bytes_per_replica_per_step": run["run"]["bytes_sent_per_replica_per_step"]}  # fmt: skip
        logger.info("%s: efficiency %s", mode, modes[mode]["efficiency"] or "none (target not reached)")
    return {"regions": region_facts(regions, one_way_s), "start_loss": start_loss,
            "target": {"mode": TARGET_MODE, "placement": "no-delay", "loss": target["curve"][-1]["validation_loss"],
                       "run": target},
            "modes": modes, "summary": summary(modes)}  # fmt: skip


# ---- output -----------------------------------------------------------------------------------------


def plot(target: dict, modes: dict[str, dict], path: Path) -> None:
    """Validation loss against wall seconds, one panel per mode: its regions run beside the target run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(modes))
    rows = math.ceil(len(modes) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.6 * rows), squeeze=False)
    reference = target["run"]["curve"]
    for axis, (mode, m) in zip(axes.flat, modes.items()):
        if "error" in m:
            axis.set_title(f"{mode}: failed", fontsize=9)
            continue
        shown = []
        for curve, style, label in ((reference, "o-", f"{target['mode']}, no delay"),
                                    (m["runs"]["regions"]["curve"], "s-", f"{mode}, regions")):  # fmt: skip
            axis.plot([p["seconds"] for p in curve], [p["validation_loss"] for p in curve], style, markersize=3,
                      label=label)  # fmt: skip
            shown += [p["validation_loss"] for p in curve[1:]]  # the start loss (far above) would flatten the rest
        axis.axhline(m["target_loss"], color="grey", linestyle=":", linewidth=1)
        reached = [m[key] for key in ("no_delay_seconds", "regions_seconds") if m[key] is not None]
        axis.plot(reached, [m["target_loss"]] * len(reached), "kx", markersize=7)
        axis.set_ylim(min(shown) - 0.03, max(shown) + 0.03)
        figure = f"efficiency {m['efficiency']:.3f}" if m["efficiency"] is not None else "target not reached"
        axis.set_title(f"{mode}: {figure}", fontsize=9)
        axis.set_xlabel("wall seconds since the first step", fontsize=8)
        axis.set_ylabel("validation loss (mean replica)", fontsize=8)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(modes) :]:
        axis.set_visible(False)
    fig.tight_layout()
    write_picture(path, fig, dpi=110)
    plt.close(fig)


def settings_of(args) -> dict:
    """The options as the results file records them: no machine paths, the model's config itself."""
    recorded = {k: v for k, v in vars(args).items() if k not in ("model_path", "config", "windows", "identities")}
    recorded["model"] = args.model if args.model in ("small", "default") else Path(args.model).name
    regions = Path(args.regions).resolve()
    recorded["regions"] = str(regions.relative_to(ROOT) if regions.is_relative_to(ROOT) else regions.name)
    return recorded


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=DEFAULT_MODES)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600, help="steps of the target run (the target is dense's loss "
                        "after them), and of every run's schedule")
    parser.add_argument("--regions-steps", type=int, help="steps of each regions run, the last ones at the "
                        "schedule's floor (default: 1.5 x --steps, a multiple of the outer steps' H)")
    parser.add_argument("--save-every", type=int, default=25,
                        help="steps between checkpoints, the points of each curve "
                             "(outer modes: the next multiple of H)")  # fmt: skip
    parser.add_argument("--region-batch-size", type=int, default=96, help="batch of every run (both placements): "
                        "sync.py's regions batch, a step about as long as a round trip between regions")  # fmt: skip
    parser.add_argument("--model", default="small", help="as sync.py's --model")
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=10.0, help="--sync-deadline of the peers")
    parser.add_argument("--average-every", type=int, default=100, help="--average-every of the peers")
    parser.add_argument("--regions", default=str(Path(__file__).with_name("regions.yaml")))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take (dense in the regions "
                        "took 3 s a step on 2 cores: 600 steps ran past 1200 s)")
    parser.add_argument("--out", default="benchmarks/results/time_to_loss")
    args = parser.parse_args()
    if args.replicas < 2 or args.steps < 1 or args.save_every < 1:
        parser.error("--replicas must be at least 2, --steps and --save-every at least 1")
    rounds = OuterConfig().steps
    outer = [mode for mode in args.modes if save_every(mode, 1) != 1]
    if args.regions_steps is None:
        args.regions_steps = math.ceil(1.5 * args.steps / (rounds if outer else 1)) * (rounds if outer else 1)
    if args.regions_steps < args.steps:
        parser.error("--regions-steps must be at least --steps")
    for name, steps in (("--steps", args.steps), ("--regions-steps", args.regions_steps)):
        if outer and steps % rounds:
            parser.error(f"{name} must be a multiple of the outer steps' H ({rounds}) for {', '.join(outer)}")
    return args


def main() -> None:
    args = arguments()
    setup_logging()
    if reason := netlab.available(delays=True):
        sys.exit(f"time_to_loss.py: error: {reason}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run every teardown on SIGTERM too
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        args.model_path = model_path(args.model, Path(tmp))
        args.config = ModelConfig.from_json_file(args.model_path) if args.model_path else ModelConfig()
        args.windows = validation_windows(args.config)
        args.identities = Path(tmp) / "identities"  # one per replica name, for every run: the same batches
        args.identities.mkdir()
        measured = run_all(args, Path(tmp))
    result = {"config": settings_of(args), "model": dataclasses.asdict(args.config), **measured}
    write_atomic(out / "time_to_loss.json", json.dumps(result, indent=2).encode())
    plot(result["target"], result["modes"], out / "time_to_loss.png")
    table = {mode: {k: v for k, v in m.items() if k != "runs"} for mode, m in result["modes"].items()}
    print(json.dumps({"target_loss": result["target"]["loss"], "modes": table, "summary": result["summary"]}, indent=2))


if __name__ == "__main__":
    main()
