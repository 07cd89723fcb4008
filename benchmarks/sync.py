"""Replica sync: DeMo payloads (16-bit and 1-bit values) against a dense fp32 all-reduce.

For each replica count (2 and 4 by default) and each mode, one swarm of separate processes on
127.0.0.1: a bootstrap node and N peers that all host the same block, start from the same
weights, take the same number of steps and then stop. Reported per mode:
- bytes each replica sent per step (the serialized DeMo payloads it served; for dense, the
  protobuf messages of hivemind's all-reduce), and the ratio dense / demo;
- the block's validation loss after the last step (every replica's final checkpoint scored
  on the same validation windows and noise), and its ratio to dense;
- step time (seconds per step over the run, median over replicas);
- drift: the largest parameter difference between any two replicas' final checkpoints, and
  the largest drift a parameter-averaging round found along the way.
With --os-check it also runs each replica in its own network namespace for a few steps and
compares the bytes counted above with what the kernel counted leaving each namespace.

    python benchmarks/sync.py --replicas 2 4 --steps 300
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path

from swarm.cli.console import setup_logging
from swarm.lab import netlab
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_block
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import block_denoise_ce
from swarm.p2p.directory import SwarmDirectory
from swarm.waiting import wait_for

logger = logging.getLogger("benchmarks.sync")

MODES = {
    "dense": ["--sync", "dense"],
    "demo16": ["--sync", "demo", "--value-bits", "16", "--top-k", "8"],
    "demo1": ["--sync", "demo", "--value-bits", "1", "--top-k", "4"],
}
VALIDATION_WINDOWS = 256
POLL_S = 2.0


def peer_extra(args, sync: list[str], replicas: int, steps: int) -> list[str]:
    return [*sync, "--wait-for-replicas", str(replicas), "--max-steps", str(steps),
            "--save-every", str(steps), "--batch-size", str(args.batch_size), "--announce-period", "2",
            "--sync-deadline", str(args.deadline), "--average-every", str(args.average_every)]  # fmt: skip


def run_mode(args, mode: str, replicas: int, workdir: Path) -> dict:
    """One swarm of `replicas` peers of block `args.block` in `mode`; its figures and loss curve."""
    swarm = f"sync{mode}{replicas}"
    with LocalSwarm(workdir, swarm=swarm, threads_per_process=1) as local:
        local.start_bootstrap()
        with local.client() as client:
            config = client.directory.wait_for_model(30)
            for r in range(replicas):
                local.start_peer(f"r{r}", str(args.block), peer_extra(args, MODES[mode], replicas, args.steps))
            curve, records = follow(client.directory, args, replicas)
        checkpoints = [local.workdir / f"r{r}" / f"block_{args.block}_step_{args.steps}.safetensors" for r in range(replicas)]
        return summarize(args, config, mode, replicas, records, curve, checkpoints)


def follow(directory: SwarmDirectory, args, replicas: int) -> tuple[list[dict], list]:
    """Poll the replicas' records until all have finished: the loss curve and the final records."""
    curve = []

    def finished() -> list:
        records = [h.announcement for h in directory.hosts(args.block)]
        for a in records:
            if a.loss is not None:
                curve.append({"replica": a.public_name, "step": a.step, "loss": a.loss, "bytes_sent": a.sync_bytes_sent})
        done = [a for a in records if a.state == "serving"]
        return sorted(done, key=lambda a: a.public_name) if len(done) == replicas else []

    records = wait_for(finished, args.timeout, f"{replicas} replicas to finish {args.steps} steps", interval=POLL_S)
    return curve, records


def summarize(args, config: ModelConfig, mode, replicas, records, curve, checkpoints: list[Path]) -> dict:
    windows = load_corpus(None).windows("validation", config.seq_len).fixed(VALIDATION_WINDOWS)
    blocks = [load_block(path, config, args.block)[0] for path in checkpoints]
    losses = [block_denoise_ce(block, config, args.block, windows) for block in blocks]
    states = [block.state_dict() for block in blocks]
    pairwise = max(
        ((a[k] - b[k]).abs().max().item() for i, a in enumerate(states) for b in states[i + 1 :] for k in a),
        default=0.0,
    )
    return {
        "mode": mode,
        "replicas": replicas,
        "steps": args.steps,
        "bytes_sent_per_replica_per_step": statistics.mean(a.sync_bytes_sent for a in records) / args.steps,
        "steps_exchanged": [a.sync_steps for a in records],
        "validation_loss": statistics.mean(losses),
        "validation_loss_per_replica": losses,
        "step_seconds": statistics.median(1 / a.throughput for a in records if a.throughput > 0),
        "drift_between_final_checkpoints": pairwise,
        "largest_drift_at_averaging": max((a.drift for a in records if a.drift is not None), default=None),
        "curve": curve,
    }


def os_check(args, workdir: Path) -> dict:
    """Each replica in its own namespace: the bytes we count beside the kernel's tx_bytes. A run
    with `--sync none` for the same steps gives what the rest (DHT, records, pings) sends."""
    if reason := netlab.available():
        return {"skipped": reason}
    result = {}
    for mode in ("dense", "demo16", "none"):
        with netlab.NetLab("bswsync") as lab, LocalSwarm(workdir / mode, swarm=f"oscheck{mode}", lab=lab) as local:
            local.start_bootstrap()
            sync = MODES.get(mode, ["--sync", "none"])
            extra = peer_extra(args, sync, args.os_replicas, args.os_steps) + ["--announce-period", "1", "--average-every", "0"]
            peers = [f"r{r}" for r in range(args.os_replicas)]
            for name in peers:
                local.start_peer(name, str(args.block), extra)
            records = wait_for(lambda: local.serving(peers), args.timeout, "the namespaced replicas", interval=POLL_S)
            kernel = {name: lab.nodes[name].counter("tx_bytes") for name in peers}
            counted = {a["public_name"]: a["sync_bytes_sent"] for a in records}
            result[mode] = {
                "steps": args.os_steps,
                "counted_bytes_sent": counted,
                "kernel_tx_bytes": kernel,
                "kernel_over_counted": {n: kernel[n] / max(1, counted[n]) for n in peers},
            }
    background = statistics.mean(result["none"]["kernel_tx_bytes"].values())
    for mode in ("dense", "demo16"):
        kernel = statistics.mean(result[mode]["kernel_tx_bytes"].values())
        result[mode]["kernel_tx_bytes_beyond_sync_none_per_step"] = (kernel - background) / args.os_steps
    result["kernel_ratio_dense_over_demo16"] = (
        result["dense"]["kernel_tx_bytes_beyond_sync_none_per_step"] / result["demo16"]["kernel_tx_bytes_beyond_sync_none_per_step"]
    )
    return result


def add_ratios(runs: list[dict]) -> dict:
    """Per replica count: dense bytes / demo bytes, and demo loss / dense loss."""
    ratios = {}
    for run in runs:
        dense = next(r for r in runs if r["mode"] == "dense" and r["replicas"] == run["replicas"])
        if run["mode"] != "dense":
            ratios[f"{run['mode']}_{run['replicas']}_replicas"] = {
                "bytes_dense_over_demo": dense["bytes_sent_per_replica_per_step"] / run["bytes_sent_per_replica_per_step"],
                "validation_loss_demo_over_dense": run["validation_loss"] / dense["validation_loss"],
            }
    return ratios


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_bytes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        points = sorted({(c["step"], c["loss"], c["bytes_sent"]) for c in run["curve"] if c["replica"] == "r0"})
        if not points:
            continue
        label = f"{run['mode']}, {run['replicas']} replicas"
        steps, losses, sent = zip(*points)
        by_step.plot(steps, losses, label=label)
        by_bytes.plot([max(b, 1) for b in sent], losses, label=label)
    by_step.set(xlabel="step", ylabel="training loss (replica r0, last 20 steps)", title="loss against steps")
    by_bytes.set(xlabel="bytes sent by replica r0", ylabel="training loss", xscale="log", title="loss against bytes sent")
    by_step.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=10.0, help="--sync-deadline of the peers")
    parser.add_argument("--average-every", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
    parser.add_argument("--os-check", action="store_true", help="also compare byte counts with the kernel's")
    parser.add_argument("--os-steps", type=int, default=20)
    parser.add_argument("--os-replicas", type=int, default=4)
    parser.add_argument("--os-check-only", action="store_true", help="only the kernel cross-check (sync_os_check.json)")
    parser.add_argument("--out", default="benchmarks/results/sync")
    args = parser.parse_args()
    setup_logging()
    if "dense" not in args.modes:
        parser.error("--modes must include dense: it is the baseline of every ratio")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.os_check_only:
        with tempfile.TemporaryDirectory() as tmp:
            kernel = os_check(args, Path(tmp))
        (out / "sync_os_check.json").write_text(json.dumps(kernel, indent=2))
        print(json.dumps(kernel, indent=2))
        return
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in args.replicas:
            for mode in args.modes:
                logger.info("%d replicas, %s: %d steps", replicas, mode, args.steps)
                runs.append(run_mode(args, mode, replicas, Path(tmp) / f"{mode}{replicas}"))
        kernel = os_check(args, Path(tmp) / "oscheck") if args.os_check else None
    result = {"config": vars(args), "ratios": add_ratios(runs), "runs": runs, "os_check": kernel}
    plot(runs, out / "sync.png")
    (out / "sync.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({**result, "runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs]}, indent=2))


if __name__ == "__main__":
    main()
