r"""The outer mode round by round: how much of the replicas' change each outer step delivers.

benchmarks/sync_gap.py measures the outer mode's loss against dense at the end of a run; this
looks inside the rounds, to find where the loss stalls and why. It takes the peers' own outer
step (`OuterOptimizer` of swarm/sync/pseudo_gradient.py) on --replicas replicas of block
--block of benchmarks/sync.py's small model (sync_gap.py's `replicas`: the same start weights,
each replica's batches drawn as a peer's are), in one process, in lockstep, with no threads and
no network: every H steps each replica makes its payload, every payload is decoded once
(refused ones counted and left out), and every replica applies the same set in peer-id order,
as Exchange.finish does. Each config of --configs is a fresh run from the same start (CONFIGS
below; the names say what differs from the defaults before issue 58, 20 values a 64 x 64 tile
and the error buffer kept whole):
- dense: the baseline, the replicas' gradients averaged every step (sync_gap.py's `dense`);
- defaults: OuterConfig() as the peers run it; old_defaults: as they ran it before issue 58;
- none: every value sent as float32 (only the compression taken away);
- k<n>: n values per tile; decay<d>: the error buffer scaled by d before each round's change is
  added; k96_decay0.5 (the defaults since issue 58), k128_decay0.5: both.
Each round it records the validation loss of the anchor (every --eval-every rounds and at the
end; sync.py's validation windows), the applied update's size over the replicas' mean change
and their cosine (over every parameter, and over the tied table `input_proj.weight` alone),
replica 0's error buffer over its change this round, and the payloads refused; of each config,
the bytes a replica sends a step (its payloads over H, to each of the others) and dense's
all-reduce bytes over them. Writes outer_rounds.json and outer_rounds.png (loss per step;
update over mean change per round) under --out.

    python benchmarks/outer_rounds.py                    # every config, 300 steps: about 6 minutes on 2 cores
    python benchmarks/outer_rounds.py --configs dense old_defaults defaults none --steps 600 --batch-size 32 \
        --eval-every 2                                   # about 13 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
from scale import dense_bytes_per_step  # hivemind's all-reduce of fp32 gradients, per replica
from sync import SMALL_MODEL, validation_windows  # the model and validation windows of benchmarks/sync.py
from sync_gap import dense, peer_ids, positive, replicas  # its replicas and dense baseline, beside this
from tqdm import tqdm

from swarm.cli.console import setup_logging
from swarm.files import write_atomic, write_picture
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig, build_block, count_parameters
from swarm.model.evaluate import block_denoise_ce
from swarm.model.train import Trainer
from swarm.sync.compression import PayloadError
from swarm.sync.pseudo_gradient import Changes, OuterConfig, OuterOptimizer

logger = logging.getLogger("benchmarks.outer_rounds")


def before_58(top_k: int = 20, error_decay: float = 1.0, **settings) -> OuterConfig:
    """The defaults before issue 58 (20 values a tile, the error buffer kept whole), with `settings` changed."""
    return OuterConfig(top_k=top_k, error_decay=error_decay, **settings)


CONFIGS: dict[str, OuterConfig | None] = {  # None: dense; the others named by what differs from before_58()
    "dense": None,
    "defaults": OuterConfig(),
    "old_defaults": before_58(),
    "none": before_58(compression="none"),
    "k128": before_58(top_k=128),
    "decay0.5": before_58(error_decay=0.5),
    "k96_decay0.5": before_58(top_k=96, error_decay=0.5),
    "k128_decay0.5": before_58(top_k=128, error_decay=0.5),
}
H = OuterConfig.steps  # every config above keeps the default H; dense is scored as often
PARTS = {"all": None, "table": "input_proj.weight"}  # the tied 8193 x 128 table: most of the block


def flat(tensors: Changes, only: str | None) -> torch.Tensor:
    return torch.cat([t.flatten().float() for name, t in tensors.items() if only in (None, name)])


def against(got: Changes, want: Changes) -> dict[str, dict[str, float]]:
    """||got|| / ||want|| and their cosine, over every parameter and over the table alone."""
    figures = {}
    for part, only in PARTS.items():
        a, b = flat(got, only), flat(want, only)
        size = b.norm().clamp_min(1e-30)
        cosine = (a @ b) / (a.norm() * size).clamp_min(1e-30)
        figures[part] = {"size_ratio": round(float(a.norm() / size), 4), "cosine": round(float(cosine), 4)}
    return figures


def local(trainers: list[Trainer], steps: int, what: str) -> None:
    """The outer mode's inner steps: each replica's own AdamW steps on its own batches."""
    for _ in tqdm(range(steps), desc=what, unit="step", mininterval=5.0):
        for trainer in trainers:
            trainer.step()


@torch.no_grad()
def outer_round(optimizers: list[OuterOptimizer], ids: list[str]) -> dict:
    """One round's exchange without the network: every payload made, decoded once in peer-id
    order (a refused one left out, as Exchange.in_order does), the same set applied by every
    replica; what the update delivered of the replicas' mean change, and what stayed behind."""
    changes = [{n: opt.anchor[n] - p.detach() for n, p in opt.params.items()} for opt in optimizers]
    mean_change = {n: sum(c[n] for c in changes) / len(changes) for n in changes[0]}
    payloads = {own: opt.make_payload() for own, opt in zip(ids, optimizers)}
    decoded, refused = [], 0
    for own in sorted(payloads):
        try:
            decoded.append((own, optimizers[0].decode(payloads[own])))
        except PayloadError:
            refused += 1
    before = {n: a.clone() for n, a in optimizers[0].anchor.items()}
    for own, opt in zip(ids, optimizers):
        opt.apply(decoded, own)
    update = {n: before[n] - a for n, a in optimizers[0].anchor.items()}
    error = against(optimizers[0].error, changes[0])
    return {"update_vs_mean_change": against(update, mean_change), "refused": refused,
            "payload_bytes": len(payloads[ids[0]]),
            "error_over_change": {part: e["size_ratio"] for part, e in error.items()}}  # fmt: skip


def run(
    name: str, config: ModelConfig, args: argparse.Namespace, windows: Windows, validation: torch.Tensor
) -> list[dict]:
    """One config from the start weights: a row per round of H steps, scored on replica 0 (which
    holds the anchor after an outer step)."""
    trainers, outer = replicas(config, args, windows, args.steps), CONFIGS[name]
    optimizers = [OuterOptimizer(t.module, outer, t.config.lr) for t in trainers] if outer else []
    rounds, rows = args.steps // H, []
    for r in range(1, rounds + 1):
        (local if outer else dense)(trainers, H, f"{name}, round {r} of {rounds}")
        row = {"step": r * H, **(outer_round(optimizers, peer_ids(args)) if outer else {})}
        if r % args.eval_every == 0 or r == rounds:
            row["validation_loss"] = round(block_denoise_ce(trainers[0].module, config, args.block, validation), 4)
            logger.info("%s: %s", name, json.dumps(row))
        rows.append(row)
    return rows


def sent_bytes(rows: list[dict], args: argparse.Namespace, parameters: int) -> dict:
    """Bytes a replica sends a step: its payloads over H to each of the --replicas - 1 others (as a
    peer's bytes_sent counts them), and dense's all-reduce of the same block over that."""
    per_step = (args.replicas - 1) * sum(row["payload_bytes"] for row in rows) / len(rows) / H
    return {"bytes_per_replica_per_step": round(per_step, 1),
            "dense_over_this": round(dense_bytes_per_step(parameters, args.replicas) / per_step, 1)}  # fmt: skip


def plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (losses, updates) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, r) in enumerate(runs.items()):
        scored = [row for row in r["rounds"] if "validation_loss" in row]
        losses.plot([row["step"] for row in scored], [row["validation_loss"] for row in scored], "o-", ms=3,
                    color=f"C{i}", label=name)  # fmt: skip
        if r["outer"] is not None:
            delivered = [row["update_vs_mean_change"]["all"]["size_ratio"] for row in r["rounds"]]
            updates.plot([row["step"] for row in r["rounds"]], delivered, "o-", ms=3, color=f"C{i}", label=name)
    losses.set(xlabel="step", ylabel="validation denoise CE", title="loss of the anchor")
    updates.set(xlabel="step", ylabel="applied update / mean change", yscale="log", title="what a round delivers")
    for panel in (losses, updates):
        if panel.lines:
            panel.legend()
    fig.tight_layout()
    write_picture(path, fig, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--steps", type=positive, default=300, help=f"steps per config (a multiple of H = {H})")
    parser.add_argument("--replicas", type=positive, default=4)
    parser.add_argument("--batch-size", type=positive, default=16, help="per replica")
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--eval-every", type=positive, default=1, help="rounds between validation scores")
    parser.add_argument("--out", default="benchmarks/results/outer_rounds")
    args = parser.parse_args()
    setup_logging()
    if args.steps % H:
        parser.error(f"--steps must be a multiple of H ({H})")
    torch.set_num_threads(2)
    config = ModelConfig(**SMALL_MODEL)
    windows, validation = load_corpus(None).windows("train", config), validation_windows(config)
    result = {"config": {**vars(args), "model": config.to_dict()}, "configs": {}}
    parameters = count_parameters(build_block(config, args.block))
    out = Path(args.out)
    for name in args.configs:
        rows = run(name, config, args, windows, validation)
        outer = CONFIGS[name]
        result["configs"][name] = {"outer": vars(outer) if outer else None, "rounds": rows,
                                   "final_loss": rows[-1]["validation_loss"],
                                   **(sent_bytes(rows, args, parameters) if outer else {})}  # fmt: skip
        write_atomic(out / "outer_rounds.json", json.dumps(result, indent=2).encode())  # what is done so far
        plot(result["configs"], out / "outer_rounds.png")
    logger.info("final validation loss: %s", {n: r["final_loss"] for n, r in result["configs"].items()})


if __name__ == "__main__":
    main()
