"""Keeping replicas in step: the sync modes side by side, the outer mode's and DeMo's loss gaps, the outer mode
round by round, what a new replica buys, time to a loss across regions, and what a block costs as it grows."""

from __future__ import annotations

import functools
from collections.abc import Callable

from .formatting import (
    DASH,
    command,
    fixed,
    heading,
    later_runs,
    parts,
    percent,
    plain,
    section,
    settings,
    size,
    table,
    targets_table,
    times,
    with_later_runs,
    yes,
)
from .reading import Folder, Node


def sync(folder: Folder) -> list[str]:
    later = later_runs(folder, lambda sub, title: sync_run(sub, "sync.json", title))
    body = sync_run(folder, "sync.json", "") + os_check(folder) + later
    if "demo" not in folder.json("sync.json").names():  # DeMo's settings recorded since its step changed
        stale = (
            "Its DeMo runs took DeMo's sign step, replaced in issue 47 (docs/decisions.md): their losses await a rerun."
        )
        body = [stale, ""] + body
    return section(
        "Runs replicas of one block of a small model in separate processes and syncs them in each mode: dense "
        "fp32 gradients (the baseline), DeMo in lockstep or overlapped, outer steps on a compressed "
        "pseudo-gradient; on 127.0.0.1, then (as root) in emulated regions. Bytes are per replica per step, "
        "losses are validation losses at equal steps, utilisation is compute time over wall time (lowest and mean "
        "replica), drift is the largest difference between the replicas' final checkpoints. Needs "
        "`pip install -e '.[bench]'`.",
        body,
    )


SYNC_OPTIONS = ("replicas", "steps", "modes", "region_replicas", "region_steps", "region_modes")


WAIT_COLUMNS = {"network_wait_fraction_max": "network wait", "slower_replica_wait_fraction_max": "slower-replica wait",
                "spare_batch_fraction_max": "spare batches"}  # fmt: skip


def sync_run(folder: Folder, name: str, title: str) -> list[str]:
    """One sync.py results file: its command, settings, one table per placement, its targets."""
    s = folder.json(name)
    config = s["config"]
    lines = heading(title)
    lines += [command("sync.py", {k: config[k] for k in SYNC_OPTIONS}, root=True), "",
              settings(config, set(SYNC_OPTIONS)), ""]  # fmt: skip
    for group, modes in s["summary"]["side_by_side"].items():
        waits = [c for c in WAIT_COLUMNS if any(c in row.names() for _, row in modes.items())]
        header = ["mode", "steps", "bytes", "dense / mode", "loss", "loss / dense", "util. min", "util. mean", "step s"]
        header += [WAIT_COLUMNS[c] for c in waits] + ["drift"]
        rows = [sync_row(mode, row, waits, drift(s["runs"], group, mode, row)) for mode, row in modes.items()]
        lines += [f"{plain(group)}:", ""] + table(header, rows)
    return lines + targets_table(s["summary"]["targets"]) + [folder.pictures(), ""]


def sync_row(mode: str, row: Node, waits: list[str], drift_value: float | None) -> list[str]:
    return [mode, plain(row["steps"]), size(row.num("bytes_sent_per_replica_per_step")),
            times(row.get("bytes_dense_over_mode")), fixed(row.num("validation_loss")),
            times(row.get("validation_loss_mode_over_dense")), fixed(row.num("compute_utilisation_min")),
            fixed(row.num("compute_utilisation_mean")), fixed(row.num("step_seconds"))] + \
        [percent(row.get(c)) for c in waits] + [fixed(drift_value, 4)]  # fmt: skip


def drift(runs: Node, group: str, mode: str, row: Node) -> float | None:
    """The drift between final checkpoints of the run a summary row comes from ("regions, 4 replicas")."""
    placement = group.split(",")[0]
    for run in runs:
        if (run["mode"], run["steps"], run["placement"]) == (mode, row["steps"], placement):
            return run.num("drift_between_final_checkpoints")
    return None


def os_check(folder: Folder) -> list[str]:
    """sync_os_check.json: the bytes the peers counted beside what the kernel sent."""
    if not (folder.path / "sync_os_check.json").exists():
        return []
    check = folder.json("sync_os_check.json")
    rows = []
    for mode, run in check.items():
        if isinstance(run, Node):
            counted = [run["counted_bytes_sent"].num(r) for r in run["counted_bytes_sent"].names()]
            kernel = [run["kernel_tx_bytes"].num(r) for r in run["kernel_tx_bytes"].names()]
            rows.append([mode, plain(run["steps"]), size(sum(counted) / len(counted)), size(sum(kernel) / len(kernel))])
    return [
        "### The kernel's count", "", command("sync.py", {"os_check_only": True}, root=True), "",
        ("Bytes each replica counted as sent for sync beside what the kernel sent from its namespace (mean "
         f"replica; the kernel's count includes DHT traffic and headers). Dense over DeMo by the kernel's count: "
         f"{times(check.num('kernel_ratio_dense_over_demo16'))}."), "",
    ] + table(["mode", "steps", "counted", "kernel"], rows)  # fmt: skip


def sync_gap(mode: str, what: str) -> Callable[[Folder], list[str]]:
    """The renderer of benchmarks/sync_gap.py's results folder for `mode` (<mode>_gap), under `what`."""
    return lambda folder: with_later_runs(folder, functools.partial(sync_gap_run, mode), what)


outer_gap = sync_gap(
    "outer",
    "Runs the outer mode's replicas and the dense baseline (gradients averaged every step) in one process, "
    "with no network, for longer than peers could run here, to see whether the outer mode's loss gap closes "
    "as the run grows longer.",
)
demo_gap = sync_gap(
    "demo",
    "Runs DeMo's replicas (`--sync demo`, every step's payloads exchanged) and the dense baseline in one "
    "process, with no network: the quick check of whether DeMo learns as dense does at equal steps.",
)
demo_overlap_gap = sync_gap(
    "demo-overlap",
    "Runs `--sync demo-overlap`'s replicas (each step's set applied a step late, each replica's own update "
    "taken ahead meanwhile) and the dense baseline in one process, with no network.",
)


def sync_gap_run(mode: str, folder: Folder, title: str) -> list[str]:
    """<mode>_gap.json of benchmarks/sync_gap.py (outer_gap.py before it took --mode: the same options)."""
    g = folder.json(f"{mode}_gap.json")
    config = g["config"]
    rows = [[plain(r["steps"]), fixed(r.num("dense_loss")), fixed(r.num(f"{mode}_loss")),
             times(r.num(f"{mode}_over_dense")), size(r.num(f"{mode}_payload_bytes_per_step"))]
            for r in g["runs"]]  # fmt: skip
    mode_options = ("outer_lr", "outer_top_k", "outer_error_decay") if mode == "outer" else ("momentum_decay",)
    options = {k: config[k] for k in ("steps", "replicas", "batch_size", "block", *mode_options) if k in config.names()}
    # in the command, or the other mode's option
    shown = {"mode", "outer_lr", "outer_top_k", "outer_error_decay", "momentum_decay", *options}
    return (
        heading(title)
        + [command("sync_gap.py", {"mode": mode, **options}), "", settings(config, shown), ""]
        + parts(plain(g.get("note") or ""))  # why a later run was made
        + table(["steps", "dense loss", f"{mode} loss", f"{mode} / dense", "payload per replica per step"], rows)
        + [folder.pictures(), ""]
    )


def outer_rounds(folder: Folder) -> list[str]:
    return with_later_runs(
        folder,
        outer_rounds_run,
        "Runs the peers' outer step on replicas of one block in one process, round by round, beside the dense "
        "baseline, to see how much of the replicas' change each outer step delivers. Configs: `defaults` "
        "(the peers' settings when the run was made; a run's note says where they differ from today's), "
        "`old_defaults` (before issue 58: 20 values per 64 x 64 tile, the error buffer kept whole), `none` "
        "(every value as float32: no compression); the others are named by what differs from `old_defaults`: "
        "`k128` (128 values per tile), `decay0.5` (the error buffer halved each round), `k96_decay0.5` and "
        "`k128_decay0.5` (both). Bytes: what a replica sends a step (its payloads over H, to each other "
        "replica), and dense's all-reduce bytes over them (runs before issue 58 did not record them). "
        "Of the last round: the applied update's size over the replicas' mean change and their cosine, over "
        "every parameter and over the tied table (`input_proj.weight`) alone, and replica 0's error buffer over "
        "its change; refused: payloads refused over the run.",
    )


OUTER_ROUNDS_OPTIONS = ("configs", "steps", "replicas", "batch_size", "block", "eval_every")


def outer_rounds_run(folder: Folder, title: str) -> list[str]:
    """outer_rounds.json of benchmarks/outer_rounds.py: one row per config, its final loss and its last round."""
    r = folder.json("outer_rounds.json")
    config, runs = r["config"], r["configs"]
    dense_loss = runs["dense"].num("final_loss") if "dense" in runs.names() else None
    rows = []
    for name, run in runs.items():
        final = run.num("final_loss")
        last = run["rounds"][-1]
        if run["outer"] is None:
            delivered = [DASH] * 6
        else:
            update, error = last["update_vs_mean_change"], last["error_over_change"]
            delivered = [fixed(update[part].num(f)) for part in ("all", "table") for f in ("size_ratio", "cosine")]
            delivered += [fixed(error.num("all")), plain(sum(row["refused"] for row in run["rounds"]))]
        sent = [size(run.get("bytes_per_replica_per_step")), times(run.get("dense_over_this"))]
        rows.append([name, fixed(final), times(final / dense_loss) if dense_loss else DASH, *sent, *delivered])
    header = ["config", "final loss", "final / dense", "bytes a replica a step", "dense's bytes / these",
              "update / mean change", "cosine", "table: update / mean change", "table: cosine",
              "error buffer / change", "refused"]  # fmt: skip
    options = {k: config[k] for k in OUTER_ROUNDS_OPTIONS}
    return heading(title) + parts(
        command("outer_rounds.py", options), settings(config, set(OUTER_ROUNDS_OPTIONS)), plain(r.get("note") or ""),
        table(header, rows),
        folder.pictures(),
    )  # fmt: skip


def replica_scaling(folder: Folder) -> list[str]:
    return with_later_runs(
        folder,
        replica_scaling_run,
        "What a new replica buys: R replicas of one block (the small model of `sync.py`, the same batch per "
        "replica, so R replicas take R times the windows a step) run in one process, in lockstep, with no "
        "network, and the steps they take to a fixed target loss are counted: steps, not seconds, because the "
        "replicas share this machine's cores. `dense` averages the replicas' gradients exactly every step; "
        "`demo` and `outer` are the peers' strategies at their defaults. The target is the validation loss one "
        "dense replica (plain AdamW) reaches after the run's `target_steps`; every run is scored every "
        "`eval_every` steps on replica 0 and stops at the first score at or below it. Speedup: the mode's steps "
        "with one replica over its steps with R, beside the ideal R; \"< x\" where R replicas did not reach the "
        "target in `max_steps` (the speedup is below one replica's steps over `max_steps`), \"> x\" where the "
        "mode's one replica did not (above `max_steps` over R's steps). Over dense's one replica: dense's one "
        "replica's steps over these.",
    )


REPLICA_SCALING_OPTIONS = ("modes", "replicas", "target_steps", "max_steps", "batch_size", "block", "eval_every",
                           "min_lr_fraction")  # fmt: skip


def replica_scaling_run(folder: Folder, title: str) -> list[str]:
    """replica_scaling.json of benchmarks/replica_scaling.py: a row per mode and replica count."""
    r = folder.json("replica_scaling.json")
    config, target = r["config"], r["target"]
    rows = []
    for mode, m in r["modes"].items():
        for row in m["speedups"]:
            steps = plain(row["steps_to_target"]) if row["reached"] else f"not in {plain(config['max_steps'])}"
            below, above = row.num("speedup_below"), row.num("speedup_above")
            speedup = fixed(row.num("speedup"), 2) if row["speedup"] is not None else DASH
            if below is not None or above is not None:
                speedup = f"< {fixed(below, 2)}" if below is not None else f"> {fixed(above, 2)}"
            rows.append([mode, plain(row["replicas"]), steps, speedup, plain(row["ideal"]),
                         fixed(row.num("over_dense_one_replica"), 2)])  # fmt: skip
    aim = (f"Target: {fixed(target.num('validation_loss'))}, the validation loss of one {plain(target['mode'])} "
           f"replica after {plain(target['steps'])} steps.")  # fmt: skip
    header = ["mode", "replicas R", "steps to the target", "speedup", "ideal", "over dense's one replica"]
    return heading(title) + parts(
        command("replica_scaling.py", {k: config[k] for k in REPLICA_SCALING_OPTIONS}),
        settings(config, set(REPLICA_SCALING_OPTIONS)),
        aim,
        plain(r.get("note") or ""),
        table(header, rows),
        folder.pictures(),
    )


TIME_TO_LOSS_OPTIONS = ("modes", "replicas", "steps", "regions_steps", "save_every")


def time_to_loss(folder: Folder) -> list[str]:
    """time_to_loss.json and the runs kept beside it (a later run adds modes with a target of its
    own). A file with a "target" holds the datacenter's target (dense with no delay, for every
    mode); one without, each mode's own no-delay run's final loss (the headline before issue 47),
    told apart in the text."""
    target = folder.json("time_to_loss.json").get("target")
    if target is not None:
        what = (f"The target is the datacenter's loss: the validation loss (mean replica) that `{target['mode']}"
                "` all-reduce with no delay reaches after the run's steps. Each mode then runs its replicas of one "
                "block in the emulated regions from the same start weights with the same batches (each replica keeps "
                "one peer id); efficiency is dense-with-no-delay's wall seconds to the target over the mode's seconds"
                " to it in the regions, each from the run's first step to the first time its curve reaches the "
                "target, linear between saves (1.0: the internet and the compression cost nothing). Where the regions"
                " runs take more steps than the target's (`regions_steps`), the schedule still spans the target's "
                "steps and the rest are at its floor. This is the sync headline; the best mode is the best compressed"
                " one.")  # fmt: skip
    else:
        what = ("Measured before issue 47, each mode against itself: the target was the mode's own no-delay run's "
                "final loss, not dense's, so a mode that ends far above dense can score near 1. A rerun of "
                "`time_to_loss.py` replaces it with the datacenter's target.")  # fmt: skip
    return with_later_runs(folder, time_to_loss_run,
                           what + " Utilisation (lowest replica) and step time of the regions run are diagnostics. "
                           "As root.")  # fmt: skip


def time_to_loss_run(folder: Folder, title: str) -> list[str]:
    """One time_to_loss.json: its command, each mode's efficiency against its run's target (the
    target run's seconds to it / the mode's regions seconds to it) and the best compressed mode."""
    r = folder.json("time_to_loss.json")
    config, s, common = r["config"], r["summary"], r.get("target") is not None
    rows = []
    for mode, m in r["modes"].items():
        if m.get("error") is not None:
            rows.append([mode, *[DASH] * 9, f"failed: {plain(m['error'])}"])
            continue
        regions = m["runs"]["regions"]
        took = fixed(m.num("regions_seconds"), 1) if m["reached"] else "not reached"
        final = m.num("final_loss") if m.get("final_loss") is not None else regions["curve"][-1].num("validation_loss")
        at_steps = fixed(m.num("loss_at_target_steps")) if m.get("loss_at_target_steps") is not None else DASH
        rows.append([mode, fixed(m.num("target_loss")), fixed(m.num("no_delay_seconds"), 1), took,
                     fixed(m.num("efficiency")), at_steps, fixed(final), times(m.num("final_loss_over_target")),
                     size(regions["run"].num("bytes_sent_per_replica_per_step")),
                     fixed(regions["run"].num("compute_utilisation_min")),
                     fixed(regions["run"].num("step_seconds"))])  # fmt: skip
    best = s["best_mode"]
    if best:
        headline = (f"Best mode: `{best}`, efficiency {fixed(s.num('best_efficiency'))}; at least {s.num('target')}: "
                    f"{yes(s['met'])}.")  # fmt: skip
    elif common and all(mode == r["target"]["mode"] for mode in r["modes"].names()):
        headline = "Dense alone: no compressed mode in this run."
    else:
        headline = "No compressed mode's regions run reached the target."
    target_s = "dense no-delay s" if common else "no-delay s"
    header = ["mode", "target loss", target_s, "regions s", "efficiency", "regions loss at the target's steps",
              "regions final loss",
              "final / target", "bytes per replica per step", "regions util. min", "regions step s"]  # fmt: skip
    return heading(title) + parts(
        command("time_to_loss.py", {k: config[k] for k in TIME_TO_LOSS_OPTIONS if k in config.names()}, root=True),
        settings(config, set(TIME_TO_LOSS_OPTIONS)),
        headline,
        plain(r.get("note") or ""),  # what changed in the code since the run, where something did
        table(header, rows),
        folder.pictures(),
    )


def scale(folder: Folder) -> list[str]:
    return with_later_runs(
        folder,
        scale_run,
        "One block at several sizes through the library's own code: the trainer's forward and backward, each sync "
        "mode's compress, encode, decode and apply with 4 replicas' payloads gathered (outer: a round spread over "
        "its H steps), bytes per replica per step against dense fp32 all-reduce, the peak RSS of a fresh process "
        "training the block beside its weights, gradients and AdamW state (and its RSS before the block: the fixed "
        "overhead; on a GPU, its peak allocation there and what was allocated before the block), the checkpoint's "
        "bytes, save and load, its download at 20 and 100 Mbit/s (bytes over the link plus the receiver's measured "
        "work), the spot check and one denoise request (4 steps, one prompt).",
    )


def scale_run(folder: Folder, title: str) -> list[str]:
    """One scale.py results file: its command, two tables, its slopes and targets."""
    r = folder.json("scale.json")
    steps, costs = [], []
    on_gpu = r["sizes"][0]["memory"].get("peak_gpu_bytes") is not None
    ahead = r["sizes"][0]["sync"]["demo"].get("step_ahead_s") is not None  # not in runs from before scale.py timed it
    floor = r["sizes"][0].get("momentum_step_s") is not None  # nor the momentum step
    for s in r["sizes"]:
        sync, memory, checkpoint = s["sync"], s["memory"], s["checkpoint"]
        name = f"{plain(s['size'])} ({s.num('parameters') / 1e6:.2f} M)"
        over_step = [percent(sync["demo"].num("step_ahead_s") / s.num("forward_backward_s"))] if ahead else []
        momentum = [percent(s.num("momentum_step_s") / s.num("forward_backward_s"))] if floor else []
        steps.append([name, fixed(s.num("forward_backward_s")), fixed(s.num("adamw_step_s")), *momentum,
                      percent(sync["demo"].num("over_forward_backward")), *over_step,
                      percent(sync["outer"].num("over_forward_backward")),
                      size(sync["dense"].num("bytes_per_replica_per_step")), times(sync["demo"].num("dense_over_mode")),
                      times(sync["outer"].num("dense_over_mode"))])  # fmt: skip
        peak = [size(memory.num("peak_gpu_bytes")), size(memory.num("gpu_overhead_bytes"))] if on_gpu else []
        costs.append([name, size(memory.num("peak_rss_bytes")), size(memory.num("overhead_bytes")), *peak,
                      size(memory.num("state_bytes")), fixed(memory.num("peak_above_overhead_over_state"), 2),
                      size(checkpoint.num("bytes")), fixed(checkpoint.num("save_s")), fixed(checkpoint.num("load_s")),
                      fixed(checkpoint["download_s"].num("20"), 2), fixed(checkpoint["download_s"].num("100"), 2),
                      fixed(s.num("spot_check_s")), fixed(s.num("denoise_s"))])  # fmt: skip
    fitted = r["slopes"]
    slopes = ", ".join(f"`{name}` {fixed(fitted.num(name), 2)}" for name in fitted.names() if fitted[name] is not None)
    smoke = "" if r["complete"] else ("Not every default size was measured: the slopes come from these sizes alone.")
    step_header = ["size (parameters)", "forward+backward s", "AdamW s",
                   *(["momentum step / f+b (DeMo's floor)"] if floor else []), "DeMo sync / f+b",
                   *(["demo-overlap step ahead / f+b"] if ahead else []), "outer sync / f+b", "dense bytes / step",
                   "dense / DeMo", "dense / outer"]  # fmt: skip
    gpu_header = ["peak GPU", "GPU before block"] if on_gpu else []
    cost_header = ["size", "peak RSS", "overhead", *gpu_header, "weights+grads+AdamW", "(peak - overhead) / that",
                   "checkpoint", "save s", "load s", "download 20 Mbit/s s", "100 Mbit/s s", "spot check s",
                   "denoise s"]  # fmt: skip
    return (
        heading(title)
        + parts(smoke, plain(r.get("note") or ""), command("scale.py", r["settings"].data))
        + table(step_header, steps)
        + table(cost_header, costs)
        + scale_memory_modes(r["sizes"])
        + [f"Slopes against the parameter count (least squares on log-log; 1 is linear): {slopes}.", ""]
        + targets_table(r["targets"])
        + [folder.pictures(), ""]
    )


MEMORY_LABELS = {"memory": "plain", "memory_checkpointed": "activations checkpointed", "memory_low": "--low-memory"}


def scale_memory_modes(sizes: Node) -> list[str]:
    """Each size trained plainly, with activation checkpointing and as `swarm-peer --low-memory`
    does (each in a fresh process): memory above the overhead and the median step time; nothing
    for a run from before scale.py measured them."""
    if sizes[0].get("memory_low") is None:
        return []
    rows = []
    for s in sizes:
        plain_s = s["memory"].num("step_s")
        for key, label in MEMORY_LABELS.items():
            memory = s[key]
            rows.append([plain(s["size"]), label, size(memory.num("peak_above_overhead_bytes")),
                         fixed(memory.num("peak_above_overhead_over_state"), 2), fixed(memory.num("step_s")),
                         times(memory.num("step_s") / plain_s)])  # fmt: skip
    header = ["size", "training", "peak - overhead", "(peak - overhead) / state", "step s", "step / plain"]
    return ["Memory by how the block trains (a fresh process each; step: forward, backward and AdamW):", ""] + table(
        header, rows
    )
