"""Replica sync at internet distance: bytes, loss and compute utilisation of every sync mode, in one run.

Modes (`swarm-peer --sync ...`): `dense` (hivemind's fp32 all-reduce of the gradients every
step: the baseline of every ratio), `demo` (DeMo in lockstep: each step waits for the other
replicas' payloads), `demo-overlap` (the same payloads, each step's exchange overlapped with
the next step's compute) and `outer` (H local AdamW steps, then one compressed pseudo-gradient
exchange; the peer's defaults, see swarm/sync/pseudo_gradient.py `OuterConfig`),
`outer-overlap` (the same, each round's exchange overlapped with the next round's steps), and
`outer-k128`, the same with 128 values kept per 64 x 64 tile instead of the default (what
the extra bytes buy in loss). `demo1` (lockstep, 1-bit values) and `demo-overlap2` / `demo-overlap3`
(each set applied two / three steps late: `--overlap-steps`) can be added with --modes or
--region-modes, and so can `demo-spare`, `demo-overlap-spare`, `demo-overlap2-spare` and
`outer-overlap-spare`: the same, but a replica that would wait for the others computes spare
batches of an eighth of its batch instead, which its next step averages in (`--spare-batch-size`).

For each replica count of --replicas (with the matching --steps) and each mode: one swarm of
separate processes on 127.0.0.1, a bootstrap node and N peers that all host the same block of
a small model (--model), start from the same weights, take the same number of steps and stop.
Then, with --region-replicas, the modes of --region-modes again, each replica in its own
network namespace in one of us-east, eu-west and ap-southeast (in turn), with the one-way
delays and link caps of benchmarks/regions.yaml (swarm/lab/netlab.py; needs root, iptables
and NetfilterQueue: where it cannot run, the JSON says why). Reported per run:
- bytes each replica sent per step for sync: the payload exchange's messages, requests
  included, plus every message of hivemind's all-reduce (dense gradient steps and
  parameter-averaging rounds alike), as the peer announces them; and dense / this mode;
- validation loss of the block after the last step (every replica's final checkpoint scored on
  the same validation windows and noise) and its ratio to dense at the same replica count;
- compute utilisation per replica, as the peer announces it (swarm/model/train.py
  `Trainer.utilisation`): seconds in forward, backward and the optimizer or sync update, less
  what the update waited on other replicas, over the wall time from the first step's start to
  the last step's end (parameter-averaging rounds and saves count as wall time, not compute).
  With several processes per core, time a process waits for the CPU inside a step counts as
  compute: utilisation says how long the trainer waited for the *network*. Each replica's wall
  time starts at its own first step, so the first exchange also absorbs how far apart the
  replicas started (up to about an announce period: 2 s here, 1 s in the regions runs), a
  start-up cost that a run of hours would not notice but a run of a minute does;
- step time, the last sync round's duration, and drift between the final checkpoints.
The summary holds the ratios, how they change from the first replica count to the next, and
each target of issue 15 with the figure it was judged on. With --os-check it also runs each
replica in its own namespace for a few steps and compares the bytes counted above with what
the kernel counted leaving each namespace.

    python benchmarks/sync.py --replicas 4 8 --steps 300 120 --region-replicas 4 --region-steps 120
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from swarm.cli.console import setup_logging
from swarm.files import write_atomic, write_picture
from swarm.lab import netlab
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_block
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import block_denoise_ce
from swarm.p2p.directory import DHTUnavailable, SwarmDirectory
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.modes import MODES as PEER_MODES
from swarm.sync.pseudo_gradient import OuterConfig
from swarm.waiting import wait_for

logger = logging.getLogger("benchmarks.sync")

# every mode of the peer's table (swarm/sync/modes.py) under its own name, on the peer's defaults (dense first:
# the baseline of every ratio; not "none", which keeps nothing in step), then variants: a mode with options changed
MODES = {name: ["--sync", name] for name in sorted(PEER_MODES, key=lambda name: name != "dense") if name != "none"}
MODES |= {
    "demo-overlap2": [*MODES["demo-overlap"], "--overlap-steps", "2"],  # each step's set applied two steps late
    "demo-overlap3": [*MODES["demo-overlap"], "--overlap-steps", "3"],
    "outer-k128": [*MODES["outer"], "--outer-top-k", "128"],  # less compressed: what the bytes buy in loss
    "demo1": [*MODES["demo"], "--value-bits", "1", "--top-k", "4"],
}
# the same as their namesakes, but a replica computes spare batches instead of waiting (--spare-batch-size, in run_mode)
MODES |= {f"{mode}-spare": MODES[mode] for mode in ("demo", "demo-overlap", "demo-overlap2", "outer-overlap")}
# a -spare mode's spare batches hold an eighth of a step's batch: a wait ends at most that late
SPARE_BATCHES_PER_BATCH = 8
DEFAULT_MODES = ["dense", "demo", "demo-overlap", "outer", "outer-overlap", "outer-k128"]
SMALL_MODEL = {"d_model": 128, "n_layers": 4, "n_blocks": 4, "n_heads": 4}  # a block of 0.38 M parameters
REGION_ORDER = ("us-east", "eu-west", "ap-southeast")  # replica i goes to REGION_ORDER[i % 3]
HUB_REGION = "eu-west"  # the bootstrap node and the benchmark's own client
VALIDATION_WINDOWS = 256
POLL_S = 2.0
UTILISATION_TARGET = 0.95
BYTE_RATIO_TARGET = 5000.0
LOSS_RATIO_TARGET = 1.02


def peer_extra(
    args,
    sync: list[str],
    replicas: int,
    steps: int,
    batch_size: int | None = None,
    announce_period: float = 2,
    save_every: int | None = None,
    schedule_steps: int | None = None,
) -> list[str]:
    schedule = ["--schedule-steps", str(schedule_steps)] if schedule_steps else []
    return [*sync, *schedule, "--wait-for-replicas", str(replicas), "--max-steps", str(steps),
            "--save-every", str(save_every or steps), "--batch-size", str(batch_size or args.batch_size),
            "--announce-period", str(announce_period),
            "--sync-deadline", str(args.deadline), "--average-every", str(args.average_every)]  # fmt: skip


def run_mode(
    args,
    mode: str,
    replicas: int,
    steps: int,
    workdir: Path,
    lab: netlab.NetLab | None = None,
    placement: str | None = None,
    save_every: int | None = None,
    identities: Path | None = None,
    schedule_steps: int | None = None,
) -> dict:
    """One swarm of `replicas` peers of block `args.block` in `mode` (on 127.0.0.1, or in `lab`'s
    regions); its figures and loss curve. `placement` names the run (default "regions" in a lab,
    else "local"); `save_every` is the peers' --save-every (default: the last step only);
    `identities` is a folder of one libp2p identity file per replica name, made by the first run
    that uses it: a replica keeps its peer id across runs, and with it its batches (a replica's
    stream of batches is seeded by its peer id), so that two runs differ only in what they vary;
    `schedule_steps` is the peers' --schedule-steps (default: their schedule spans `steps`)."""
    placement = placement or ("regions" if lab else "local")
    batch_size = args.region_batch_size if lab else args.batch_size
    swarm = f"sync{mode.replace('-', '')}{replicas}{placement.replace('-', '')}"
    names = [f"r{r}" for r in range(replicas)]
    with LocalSwarm(workdir, swarm=swarm, config_path=args.model_path, threads_per_process=1, lab=lab) as local:
        local.start_bootstrap()
        with local.client() as client:
            config = client.directory.wait_for_model(60)
            traces = {name: local.workdir / f"{name}.sync-trace.jsonl" for name in names}
            for path in traces.values():
                path.unlink(missing_ok=True)  # a peer appends to its trace: no events of an earlier run
            spare = (
                ["--spare-batch-size", str(max(1, batch_size // SPARE_BATCHES_PER_BATCH))]
                if mode.endswith("-spare")
                else []
            )
            for name in names:
                extra = peer_extra(
                    args, [*MODES[mode], *spare], replicas, steps, batch_size, 1 if lab else 2, save_every,
                    schedule_steps,
                )
                identity = ["--identity", str(identities / f"{name}.id")] if identities else []
                local.start_peer(name, str(args.block), [*extra, *identity, "--sync-trace", str(traces[name])])
            curve, records = follow(
                local, client.directory, args, replicas, steps, f"{mode}, {replicas} replicas, {placement}"
            )
        checkpoints = [local.workdir / name / f"block_{args.block}_step_{steps}.safetensors" for name in names]
        result = summarize(args, config, mode, replicas, steps, records, curve, checkpoints)
        result["waits"] = wait_split(traces)
    result["placement"], result["batch_size"] = placement, batch_size
    if lab:
        result["regions"] = {name: lab.nodes[name].region for name in names}
    return result


def follow(
    local: LocalSwarm, directory: SwarmDirectory, args, replicas: int, steps: int, what: str
) -> tuple[list[dict], list]:
    """Poll the replicas' records until all have finished: the loss curve and the final records."""
    curve = []
    bar = tqdm(total=steps, desc=what, unit="step", mininterval=5.0)

    def finished() -> list:
        local.check_running()
        try:
            records = [h.announcement for h in directory.hosts(args.block)]
        except DHTUnavailable as error:  # a slow DHT read: the next poll asks again
            logger.warning("%s", error)
            return []
        for a in records:
            if a.loss is not None:
                curve.append(
                    {"replica": a.public_name, "step": a.step, "loss": a.loss, "bytes_sent": a.sync_bytes_sent}
                )
        bar.update(max(0, min((a.step for a in records), default=0) - bar.n))
        done = [a for a in records if a.state == "serving"]
        return sorted(done, key=lambda a: a.public_name) if len(done) == replicas else []

    try:
        records = wait_for(finished, args.timeout, f"{replicas} replicas to finish {steps} steps", interval=POLL_S)
    finally:
        bar.close()
    return curve, records


def validation_windows(config: ModelConfig) -> torch.Tensor:
    """The windows every checkpoint is scored on: the same ones (and, in `block_denoise_ce`, the same
    noise) for every run, mode and benchmark that compares validation losses with this one's."""
    return load_corpus(None).windows("validation", config).fixed(VALIDATION_WINDOWS)


def summarize(args, config: ModelConfig, mode, replicas, steps, records, curve, checkpoints: list[Path]) -> dict:
    windows = validation_windows(config)
    blocks = [load_block(path, config, args.block)[0] for path in checkpoints]
    losses = [block_denoise_ce(block, config, args.block, windows) for block in blocks]
    states = [block.state_dict() for block in blocks]
    pairwise = max(
        ((a[k] - b[k]).abs().max().item() for i, a in enumerate(states) for b in states[i + 1 :] for k in a),
        default=0.0,
    )
    utilisation = {a.public_name: a.compute_utilisation for a in records}
    known = [u for u in utilisation.values() if u is not None]
    return {
        "mode": mode,
        "replicas": replicas,
        "steps": steps,
        "bytes_sent_per_replica_per_step": statistics.mean(a.sync_bytes_sent for a in records) / steps,
        "bytes_sent_per_replica": {a.public_name: a.sync_bytes_sent for a in records},
        "steps_exchanged": [a.sync_steps for a in records],
        "validation_loss": statistics.mean(losses),
        "validation_loss_per_replica": losses,
        "compute_utilisation": utilisation,
        "compute_utilisation_mean": statistics.mean(known) if known else None,
        "compute_utilisation_min": min(known) if known else None,
        "step_seconds": statistics.median(1 / a.throughput for a in records if a.throughput > 0),
        # over its last steps
        "step_seconds_per_replica": {a.public_name: 1 / a.throughput for a in records if a.throughput > 0},
        "last_sync_round_seconds": {a.public_name: a.sync_round_s for a in records},
        "drift_between_final_checkpoints": pairwise,
        "largest_drift_at_averaging": max((a.drift for a in records if a.drift is not None), default=None),
        "curve": curve,
    }


def wait_split(traces: dict[str, Path]) -> dict | None:
    """Each replica's waits for the others' payloads, split at the moment the last of the others
    had published the payload waited for: before it, the replica waited for a slower replica's
    compute; after it, for the network (the delay line, the links, the exchange's own calls). A
    wait for a step some other replica never published (it left, or jumped ahead) counts as
    waiting for a slower replica. Seconds, and fractions of the replica's traced time (its first
    publish to its last wait: for outer modes that leaves out the first round, so the fractions
    are larger than the same seconds over the run's wall time). None for a mode without a
    payload exchange (dense). Time spent on spare batches instead of waiting (the -spare modes)
    is reported beside them (`spare_s`, `spare_fraction`, `spare_windows`): it is compute, not a wait.
    In those modes a wait begins only once the gather is done, so both kinds of wait are near 0
    by construction: the spare fraction is what the others would have been."""
    events = {
        name: [json.loads(line) for line in path.read_text().splitlines()]
        for name, path in traces.items()
        if path.exists()
    }
    published = {name: {e["step"]: e["t"] for e in evs if e["event"] == "publish"} for name, evs in events.items()}
    published = {name: steps for name, steps in published.items() if steps}  # a peer that died before its first step
    if not published:
        return None
    split = {}
    for name in published:
        network = slower = spare = 0.0
        windows = 0
        for wait in (e for e in events[name] if e["event"] == "wait"):
            spare += wait["spare_seconds"]
            windows += wait["spare_windows"]
            began = wait["t"] - wait["seconds"]
            others = [steps.get(wait["step"]) for other, steps in published.items() if other != name]
            network_part = 0.0 if None in others else max(0.0, wait["t"] - max([began, *others]))
            network += network_part
            slower += wait["seconds"] - network_part
        span = max(e["t"] for e in events[name]) - min(published[name].values())
        share = lambda seconds, span=span: seconds / span if span > 0 else None
        split[name] = {"network_s": network, "slower_replicas_s": slower, "traced_s": span,
                       "network_fraction": share(network), "slower_replicas_fraction": share(slower),
                       "spare_s": spare, "spare_fraction": share(spare), "spare_windows": windows}  # fmt: skip
    return split


def region_runs(args, workdir: Path) -> dict:
    """The --region-modes with --region-replicas replicas, each in a namespace of its region."""
    if reason := netlab.available(delays=True):
        logger.warning("no emulated regions: %s", reason)
        return {"skipped": reason}
    regions, one_way_s = netlab.load_regions(Path(args.regions))
    runs = []
    for mode in args.region_modes:
        logger.info("regions, %d replicas, %s: %d steps", args.region_replicas, mode, args.region_steps)
        with region_lab(args.region_replicas, regions, one_way_s) as lab:
            runs.append(run_mode(args, mode, args.region_replicas, args.region_steps, workdir / f"regions-{mode}", lab))
    return {**region_facts(regions, one_way_s), "runs": runs}


def region_facts(regions: dict, one_way_s: Callable[[str, str], float]) -> dict:
    """What the regions runs' network was: the round trips between the replicas' regions and their link caps."""
    rtts = {
        f"{a}-{b}": round(2000 * one_way_s(a, b)) for i, a in enumerate(REGION_ORDER) for b in REGION_ORDER[i + 1 :]
    }
    return {"round_trip_ms": rtts, "link_caps_mbit": {r: regions[r] for r in REGION_ORDER}}


@contextlib.contextmanager
def region_lab(
    replicas: int, regions: dict | None, one_way_s: Callable[[str, str], float], prefix: str = "bswsync"
) -> Iterator[netlab.NetLab]:
    """The lab of a regions run: the bootstrap node and the benchmark's client in HUB_REGION,
    replica i (`r<i>`) in REGION_ORDER[i % 3], each node's link caps (`regions`, as
    `netlab.load_regions` reads them; None: no caps) and the delay line (`one_way_s`)."""
    with netlab.NetLab(prefix) as lab:
        lab.add_node("bootstrap", HUB_REGION)
        lab.add_node("client", HUB_REGION)
        for r in range(replicas):
            lab.add_node(f"r{r}", REGION_ORDER[r % len(REGION_ORDER)])
        for node in lab.nodes.values():
            caps = regions[node.region] if regions else {}
            lab.cap(node, caps.get("up_mbit"), caps.get("down_mbit"))
        lab.start_delays(one_way_s)
        yield lab


def os_check(args, workdir: Path) -> dict:
    """Each replica in its own namespace: the bytes we count beside the kernel's tx_bytes. A run
    with `--sync none` for the same steps gives what the rest (DHT, records, pings) sends."""
    if reason := netlab.available():
        return {"skipped": reason}
    result = {}
    for mode in ("dense", "demo", "none"):
        with (
            netlab.NetLab("bswsync") as lab,
            LocalSwarm(workdir / mode, swarm=f"oscheck{mode}", lab=lab, config_path=args.model_path) as local,
        ):
            local.start_bootstrap()
            sync = MODES.get(mode, ["--sync", "none"])
            extra = peer_extra(args, sync, args.os_replicas, args.os_steps) + [
                "--announce-period",
                "1",
                "--average-every",
                "0",
            ]
            peers = [f"r{r}" for r in range(args.os_replicas)]
            for name in peers:
                local.start_peer(name, str(args.block), extra)
            records = wait_for(
                lambda peers=peers: local.serving(peers), args.timeout, "the namespaced replicas", interval=POLL_S
            )
            kernel = {name: lab.nodes[name].counter("tx_bytes") for name in peers}
            counted = {a["public_name"]: a["sync_bytes_sent"] for a in records}
            result[mode] = {
                "steps": args.os_steps,
                "counted_bytes_sent": counted,
                "kernel_tx_bytes": kernel,
                "kernel_over_counted": {n: kernel[n] / max(1, counted[n]) for n in peers},
            }
    background = statistics.mean(result["none"]["kernel_tx_bytes"].values())
    for mode in ("dense", "demo"):
        kernel = statistics.mean(result[mode]["kernel_tx_bytes"].values())
        result[mode]["kernel_tx_bytes_beyond_sync_none_per_step"] = (kernel - background) / args.os_steps
    result["kernel_ratio_dense_over_demo"] = (
        result["dense"]["kernel_tx_bytes_beyond_sync_none_per_step"]
        / result["demo"]["kernel_tx_bytes_beyond_sync_none_per_step"]
    )
    return result


def side_by_side(runs: list[dict], dense_runs: list[dict]) -> dict:
    """Per placement and replica count, per mode: bytes per step, dense / mode, loss / dense's,
    utilisation. A run with no dense run of its own (regions) is compared with the local dense
    run of the same replica count: the bytes a mode sends do not depend on where the replicas are."""
    table = {}
    for run in runs:
        dense = next(
            (d for d in dense_runs if d["replicas"] == run["replicas"] and d["placement"] == run["placement"]), None
        )
        dense = dense or next((d for d in dense_runs if d["replicas"] == run["replicas"]), None)
        row = {
            "steps": run["steps"],
            "bytes_sent_per_replica_per_step": run["bytes_sent_per_replica_per_step"],
            "validation_loss": run["validation_loss"],
            "compute_utilisation_mean": run["compute_utilisation_mean"],
            "compute_utilisation_min": run["compute_utilisation_min"],
            "step_seconds": run["step_seconds"],
        }
        if run.get("waits"):  # the most any replica lost to each kind of wait
            row["network_wait_fraction_max"] = max(w["network_fraction"] or 0.0 for w in run["waits"].values())
            row["slower_replica_wait_fraction_max"] = max(
                w["slower_replicas_fraction"] or 0.0 for w in run["waits"].values()
            )
            row["spare_batch_fraction_max"] = max(w["spare_fraction"] or 0.0 for w in run["waits"].values())
        if dense is not None:
            row["dense_run"] = f"{dense['placement']}, {dense['replicas']} replicas, {dense['steps']} steps"
            row["bytes_dense_over_mode"] = dense["bytes_sent_per_replica_per_step"] / max(
                run["bytes_sent_per_replica_per_step"], 1e-9
            )
            if dense["steps"] == run["steps"]:
                row["validation_loss_mode_over_dense"] = run["validation_loss"] / dense["validation_loss"]
        table.setdefault(f"{run['placement']}, {run['replicas']} replicas", {})[run["mode"]] = row
    return table


def scaling(table: dict, counts: list[int]) -> dict:
    """How the byte ratio and the utilisation change from the first replica count to each next one."""
    if len(counts) < 2:
        return {}
    first = table.get(f"local, {counts[0]} replicas", {})
    change = {}
    for count in counts[1:]:
        other = table.get(f"local, {count} replicas", {})
        for mode in first:
            if mode not in other:
                continue
            a, b = first[mode], other[mode]
            entry = {"bytes_per_step": [a["bytes_sent_per_replica_per_step"], b["bytes_sent_per_replica_per_step"]],
                     "compute_utilisation_mean": [a["compute_utilisation_mean"],
                                                  b["compute_utilisation_mean"]]}  # fmt: skip
            if "bytes_dense_over_mode" in a and "bytes_dense_over_mode" in b:
                entry["bytes_dense_over_mode"] = [a["bytes_dense_over_mode"], b["bytes_dense_over_mode"]]
            change.setdefault(f"{counts[0]} -> {count} replicas", {})[mode] = entry
    return change


def targets(table: dict, counts: list[int], region_replicas: int) -> dict:
    """Issue 15's targets, each with the figure it is judged on (None: not measured in this run)."""
    local = table.get(f"local, {counts[0]} replicas", {}).get("outer", {})
    regions = table.get(f"regions, {region_replicas} replicas", {})
    verdicts = {
        f"outer bytes dense/outer >= {BYTE_RATIO_TARGET:.0f} ({counts[0]} replicas)": _judge(
            local.get("bytes_dense_over_mode"), lambda v: v >= BYTE_RATIO_TARGET),
        f"outer validation loss / dense <= {LOSS_RATIO_TARGET} at equal steps ({counts[0]} replicas)": _judge(
            local.get("validation_loss_mode_over_dense"), lambda v: v <= LOSS_RATIO_TARGET),
    }  # fmt: skip
    overlapped = (m for m in regions if m.startswith(("demo-overlap", "outer-overlap")))
    for mode in dict.fromkeys(("demo-overlap", "outer", "outer-overlap", *overlapped)):
        figure = regions.get(mode, {}).get("compute_utilisation_min")
        verdicts[f"{mode} utilisation >= {UTILISATION_TARGET} in regions (lowest replica)"] = _judge(
            figure, lambda v: v >= UTILISATION_TARGET
        )
    if "demo" in regions:
        verdicts["lockstep demo utilisation in regions (lowest replica, for comparison)"] = {
            "figure": regions["demo"]["compute_utilisation_min"]
        }
    return verdicts


def _judge(figure, test) -> dict:
    return {"figure": figure, "met": None if figure is None else bool(test(figure))}


def plot(runs: list[dict], table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_bytes, by_use, by_step) = plt.subplots(1, 3, figsize=(18, 5))
    groups = list(table)
    modes = [m for m in MODES if any(m in table[g] for g in groups)]
    width = 0.8 / max(1, len(groups))
    for i, group in enumerate(groups):
        xs = [j + i * width for j, m in enumerate(modes) if m in table[group]]
        rows = [table[group][m] for m in modes if m in table[group]]
        bars = by_bytes.bar(xs, [r["bytes_sent_per_replica_per_step"] for r in rows], width, label=group)
        for bar, row in zip(bars, rows):
            if "bytes_dense_over_mode" in row and row["bytes_dense_over_mode"] > 1.01:
                by_bytes.annotate(f"{row['bytes_dense_over_mode']:,.0f}x",
                                  (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                  ha="center", va="bottom", fontsize=7, rotation=90)  # fmt: skip
        by_use.bar(xs, [r["compute_utilisation_min"] or 0 for r in rows], width, label=group)
    for axis in (by_bytes, by_use):
        axis.set_xticks([j + width * (len(groups) - 1) / 2 for j in range(len(modes))], modes)
    by_bytes.set(
        yscale="log", ylabel="bytes sent per replica per step", title="sync bytes per step (label: dense / mode)"
    )
    by_use.axhline(UTILISATION_TARGET, color="r", linestyle="--", linewidth=1)
    by_use.set(ylim=(0, 1.05), ylabel="compute utilisation (lowest replica)", title="compute / wall time per replica")
    by_use.legend(fontsize=8, loc="lower left")
    by_bytes.legend(fontsize=8)
    for run in runs:
        if run["placement"] != "local" or run["replicas"] != runs[0]["replicas"]:
            continue
        points = sorted({(c["step"], c["loss"]) for c in run["curve"] if c["replica"] == "r0"})
        if points:
            by_step.plot(*zip(*points), label=f"{run['mode']} (val {run['validation_loss']:.3f})")
    by_step.set(
        xlabel="step",
        ylabel="training loss (r0, last 20 steps)",
        title=f"loss against steps, {runs[0]['replicas']} replicas",
    )
    by_step.legend(fontsize=8)
    fig.tight_layout()
    write_picture(path, fig, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[4, 8])
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[300, 120], help="steps of each --replicas run (one value: all)"
    )
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=DEFAULT_MODES)
    parser.add_argument("--model", default="small", help="'small' (d_model 128, 4 layers in 4 blocks), 'default' "
                        "(the built-in model) or a model config JSON file")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=10.0, help="--sync-deadline of the peers")
    parser.add_argument("--average-every", type=int, default=100)
    parser.add_argument("--region-replicas", type=int, default=4, help="replicas of the regions runs (0: none)")
    parser.add_argument("--region-steps", type=int, default=120)
    parser.add_argument("--region-batch-size", type=int, default=96, help="batch of the regions runs: a step that "
                        "takes about as long as a round trip between regions, as a real model's step does")  # fmt: skip
    parser.add_argument(
        "--region-modes", nargs="+", choices=list(MODES), default=["demo", "demo-overlap", "outer", "outer-overlap"]
    )
    parser.add_argument("--regions", default=str(Path(__file__).with_name("regions.yaml")))
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds one run may take")
    parser.add_argument("--os-check", action="store_true", help="also compare byte counts with the kernel's")
    parser.add_argument("--os-steps", type=int, default=20)
    parser.add_argument("--os-replicas", type=int, default=4)
    parser.add_argument("--os-check-only", action="store_true", help="only the kernel cross-check (sync_os_check.json)")
    parser.add_argument("--out", default="benchmarks/results/sync")
    args = parser.parse_args()
    setup_logging()
    if "dense" not in args.modes:
        parser.error("--modes must include dense: it is the baseline of every ratio")
    if len(args.steps) == 1:
        args.steps = args.steps * len(args.replicas)
    if len(args.steps) != len(args.replicas):
        parser.error("give one --steps value, or one per --replicas value")
    outer_steps = OuterConfig().steps
    outer_modes = {mode for mode in (*args.modes, *args.region_modes) if mode.startswith("outer")}  # -k128, -spare too
    if outer_modes and any(s % outer_steps for s in [*args.steps, args.region_steps]):
        parser.error(f"every --steps and --region-steps must be a multiple of the outer steps' H ({outer_steps})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run every teardown on SIGTERM too
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args.model_path = model_path(args.model, Path(tmp))
        model = ModelConfig.from_json_file(args.model_path) if args.model_path else ModelConfig()
        if args.os_check_only:
            kernel = os_check(args, Path(tmp))
            write_atomic(out / "sync_os_check.json", json.dumps(kernel, indent=2).encode())
            print(json.dumps(kernel, indent=2))
            return
        runs = []
        for replicas, steps in zip(args.replicas, args.steps):
            for mode in args.modes:
                logger.info("%d replicas, %s: %d steps", replicas, mode, steps)
                runs.append(run_mode(args, mode, replicas, steps, Path(tmp) / f"{mode}{replicas}"))
        regions = region_runs(args, Path(tmp)) if args.region_replicas else {"skipped": "--region-replicas 0"}
        kernel = os_check(args, Path(tmp) / "oscheck") if args.os_check else None
    all_runs = runs + regions.get("runs", [])
    table = side_by_side(all_runs, [r for r in all_runs if r["mode"] == "dense"])
    summary = {
        "side_by_side": table,
        "scaling": scaling(table, args.replicas),
        "targets": targets(table, args.replicas, args.region_replicas),
        "regions": {k: v for k, v in regions.items() if k != "runs"},
        "outer_defaults": vars(OuterConfig()),
    }
    result = {"config": vars(args), "model": model.to_dict(), "demo": vars(DeMoConfig()), "summary": summary,
              "runs": all_runs, "os_check": kernel}  # fmt: skip
    plot(all_runs, table, out / "sync.png")
    write_atomic(out / "sync.json", json.dumps(result, indent=2).encode())
    print(json.dumps({**result, "runs": [{k: v for k, v in r.items() if k != "curve"} for r in all_runs]}, indent=2))


def model_path(model: str, folder: Path) -> str | None:
    """The model config file the bootstrap node publishes (None: the built-in model)."""
    if model == "default":
        return None
    if model == "small":
        path = folder / "small-model.json"
        path.write_text(json.dumps(SMALL_MODEL))
        return str(path)
    ModelConfig.from_json_file(model)  # a bad file fails here, before any swarm starts
    return model


if __name__ == "__main__":
    main()
