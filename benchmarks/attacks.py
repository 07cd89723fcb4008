"""Attacks on an open swarm, each beside a clean run: what honest fetches, joiners, generation and
training end up with when one peer lies (the liars are in swarm/lab/attacks.py).

Part 1, on one trained swarm (a small model, two replicas per block, DeMo sync, separate
processes on 127.0.0.1), one attack at a time, the liar removed after each:
- step lie, garbage block: a peer serving a blown-up block stamped with step 999999;
- step lie, poisoned block: a block 0 trained on text whose characters were shuffled, stamped
  one save ahead;
- oversized announcement: a record announcing a newer checkpoint of 8 GiB, served a byte a second;
- model-record hijack: another valid config written under `S.model` by a stranger's key;
- wrong answers: a peer vouching for the honest checkpoint and answering denoise requests wrongly.
For each: the fetched model's denoise_ce / the clean fetch's, which checkpoint a joiner
started from, whether generation through the swarm equals local generation, bans, time.

Part 2, training under attack: one block, three replicas, every replica from the same start
for the same steps; clean (three honest) against two honest and one hostile replica that sends
each step an honest payload negated, at the largest values allowed, or with random signs, at
16-bit and 1-bit, and against one that answers sync polls with garbage or a step of 10^12. For
each: the honest replicas' validation loss / the clean run's, and whether an honest peer crashed
or hung.

    python benchmarks/attacks.py            # about 20 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from swarm.checkpoints.store import CheckpointStore
from swarm.checkpoints.transfer import BlockServicer
from swarm.cli.console import setup_logging
from swarm.lab.attacks import (
    STEP_LIE,
    HostileNode,
    HostileReplica,
    LyingSyncReplies,
    TricklingDownloads,
    WrongAnswers,
    checkpoint_of,
    garbage_block,
    plant_checkpoint,
    poisoned_block,
)
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_block, load_model_folder
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.families import local_runner
from swarm.model.evaluate import block_denoise_ce, denoise_ce
from swarm.model.generate import continue_text
from swarm.p2p.client import SwarmClient
from swarm.p2p.info import InfoServicer
from swarm.p2p.records import CheckpointInfo
from swarm.serving.remote import RemoteBlocks
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.waiting import WaitTimeout, wait_for

logger = logging.getLogger("benchmarks.attacks")

SMALL = {"prefix_len": 32, "gen_len": 16, "d_model": 64, "n_heads": 2, "n_layers": 4, "n_blocks": 2}
VALIDATION_WINDOWS = 256
PROMPT = b"The history of the city"


def peer_options(args, steps: int, replicas: int) -> list[str]:
    return ["--max-steps", str(steps), "--save-every", str(args.save_every), "--announce-period", "1",
            "--sync", "demo", "--sync-deadline", "3", "--batch-size", "16", "--average-every", "0",
            "--wait-for-replicas", str(replicas)]  # fmt: skip


def hosts_of(client: SwarmClient, block: int, state: str = "serving") -> list:
    return [h for h in client.directory.hosts(block) if h.announcement.state == state]


# ---- part 1: a trained swarm, one liar at a time -------------------------------------------


def trained_swarm(args, local: LocalSwarm, client: SwarmClient) -> None:
    for block in range(SMALL["n_blocks"]):
        for replica in range(2):
            local.start_peer(f"b{block}r{replica}", str(block), peer_options(args, args.steps, 2))
    wait_for(lambda: all(len(hosts_of(client, b)) == 2 for b in range(SMALL["n_blocks"])), args.timeout,
             "every replica to finish", interval=2.0)  # fmt: skip
    # a third host of block 1 that starts from the checkpoint the others agree on: replicas of
    # one checkpoint, which a generation client can check against each other
    local.start_peer("b1copy", "1", peer_options(args, args.steps, 1))
    wait_for(lambda: len(hosts_of(client, 1)) == 3, args.timeout, "the copy of block 1", interval=2.0)


def fetch(local: LocalSwarm, name: str, windows) -> dict:
    started = time.monotonic()
    result = local.run("swarm-fetch", "--out", name, timeout=900)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        return {"fetched": False, "error": result.stderr.strip().splitlines()[-1:], "seconds": seconds}
    model = load_model_folder(local.workdir / name)
    blocks = model.manifest["blocks"]
    return {"fetched": True, "seconds": seconds, "denoise_ce": denoise_ce(model.denoiser_for_block, model.config, windows)["overall"],
            "steps": [blocks[str(b)]["step"] for b in range(model.config.n_blocks)],
            "spot_check_seconds": model.manifest.get("spot_check_seconds")}  # fmt: skip


def joiner_start(local: LocalSwarm, client: SwarmClient, block: int, name: str) -> dict:
    """Start a fresh replica of `block` and report the checkpoint it started from."""
    joiner = local.start_peer(name, str(block), ["--max-steps", "1", "--announce-period", "1"])
    try:
        found = wait_for(lambda: [h for h in client.directory.hosts(block) if h.announcement.public_name == name
                                  and h.announcement.state != "joining"], 120, f"joiner {name}")[0]  # fmt: skip
    finally:
        local.stop(joiner)
    checkpoint = found.announcement.checkpoint
    return {"step": checkpoint.step if checkpoint else None, "sha256": checkpoint.sha256 if checkpoint else None}


def generation(client: SwarmClient, config: ModelConfig, reference, liar: str | None = None) -> dict:
    """Text through the swarm against the same text from the clean fetched model, here."""
    runner = RemoteBlocks(client.directory, client.p2p, client.loop, config, request_timeout=20)
    if liar is not None:  # the worst case: the liar is the replica the client prefers
        for block in range(config.n_blocks):
            for host in client.directory.hosts(block):
                if host.peer_id == liar:
                    runner._rtt[host.peer_id, host.owner] = 0.0
    started = time.monotonic()
    text = b"".join(continue_text(runner, config, PROMPT, 64, steps_per_block=2, seed=1))
    expected = b"".join(continue_text(local_runner(reference.denoiser_for_block, config), config, PROMPT, 64,
                                      steps_per_block=2, seed=1))  # fmt: skip
    return {"equals_clean_local_generation": text == expected, "seconds": time.monotonic() - started,
            "cross_check": vars(runner.checks)}  # fmt: skip


def attack_step_lie(args, local, client, config, folder: Path, poisoned: bool) -> dict:
    """A garbage block 1 stamped 999999, or a poisoned block 0 (the high-noise block, where what
    the prefix says matters most) stamped one save ahead of the honest replicas."""
    name, block = ("poisoned-liar", 0) if poisoned else ("garbage-liar", 1)
    honest_step = max(h.announcement.checkpoint.step for h in hosts_of(client, block))
    if poisoned:
        denoiser, step = poisoned_block(config, block, None, folder, args.steps), honest_step + args.save_every
    else:
        denoiser, step = garbage_block(config, block), STEP_LIE
    plant_checkpoint(local.workdir / name, denoiser, config, block, step, local.swarm)
    liar = local.start_peer(name, str(block), ["--max-steps", "1", "--announce-period", "1"])
    try:
        wait_for(lambda: [h for h in hosts_of(client, block) if h.announcement.step == step], 120, f"{name} announcing")
        return {"block": block, "liar_step": step, "fetch": fetch(local, name + "-fetch", args.windows),
                "joiner": joiner_start(local, client, block, name + "-joiner"),
                "liar_alive": liar.process.poll() is None}  # fmt: skip
    finally:
        local.stop(liar)


def attack_oversized(args, local, client, config) -> dict:
    honest = max(h.announcement.checkpoint.step for h in hosts_of(client, 1))
    with HostileNode(local.swarm, local.initial_peers) as node:
        node.serve(InfoServicer(lambda: node.info(1)), TricklingDownloads(1))
        node.announce(1, **checkpoint_of(CheckpointInfo(step=honest + 1, sha256="ab" * 32, size=2**33)))
        return {"fetch": fetch(local, "oversized-fetch", args.windows)}


def attack_hijack(args, local, client, config) -> dict:
    other = ModelConfig(**{**config.to_dict(), "n_blocks": 1, "n_layers": 2})
    with HostileNode(local.swarm, local.initial_peers) as node:
        node.directory.publish_model(other, lifetime_s=600)
        status = local.run("swarm-status", "--json")
        followed = json.loads(status.stdout)["config_hash"] if status.returncode == 0 else None
        return {"status_follows_creator": followed == config.hash(), "fetch": fetch(local, "hijack-fetch", args.windows)}


def attack_wrong_answers(args, local, client, config, reference) -> dict:
    announced = [h.announcement.checkpoint for h in hosts_of(client, 1)]
    honest = max(announced, key=announced.count)  # the checkpoint most hosts vouch for
    with HostileNode(local.swarm, local.initial_peers) as node:
        empty = CheckpointStore(local.workdir / "wrong-answers", config, 1, local.swarm)  # it holds no file: downloads refused
        node.serve(InfoServicer(lambda: node.info(1)), BlockServicer(1, empty), WrongAnswers(config, 1, honest.sha256))
        node.announce(1, state="serving", **checkpoint_of(honest))
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(1)}, 30, "the liar's record")
        return {"generation": generation(client, config, reference, liar=node.peer_id),
                "fetch": fetch(local, "wrong-answers-fetch", args.windows)}


def write_config(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "small.json"
    path.write_text(json.dumps(SMALL))
    return path


def part_one(args, workdir: Path) -> dict:
    config_path, config = write_config(workdir), ModelConfig(**SMALL)
    with LocalSwarm(workdir, swarm="attacks", config_path=str(config_path)) as local:
        local.start_bootstrap(refresh_period=2)
        with local.client() as client:
            trained_swarm(args, local, client)
            clean = fetch(local, "clean-fetch", args.windows)
            reference = load_model_folder(local.workdir / "clean-fetch")
            results = {"clean": {"fetch": clean, "generation": generation(client, config, reference)}}
            attacks = {
                "step_lie_garbage_block": lambda: attack_step_lie(args, local, client, config, workdir, poisoned=False),
                "step_lie_poisoned_block": lambda: attack_step_lie(args, local, client, config, workdir, poisoned=True),
                "oversized_announcement": lambda: attack_oversized(args, local, client, config),
                "model_record_hijack": lambda: attack_hijack(args, local, client, config),
                "wrong_denoise_answers": lambda: attack_wrong_answers(args, local, client, config, reference),
            }
            for name, attack in attacks.items():
                logger.info("attack: %s", name)
                results[name] = attack()
                fetched = results[name]["fetch"]
                if fetched.get("fetched"):
                    results[name]["denoise_ce_over_clean"] = fetched["denoise_ce"] / clean["denoise_ce"]
            honest_peers = [h for h in local.started if h.name.startswith("b")]
            results["honest_peers_crashed"] = sum(h.process.poll() not in (None, 0) for h in honest_peers)
    return results


# ---- part 2: training with a hostile replica among three ----------------------------------------


def training_run(args, workdir: Path, value_bits: int, attack: str | None) -> dict:
    """Block 0 trained by three replicas: three honest ones, or two and a hostile one (or, for
    "alone", two honest replicas and nobody else: the best any defence can keep of three)."""
    config_path = write_config(workdir)
    config = ModelConfig(**SMALL)
    honest_names = ["h0", "h1"] if attack else ["h0", "h1", "h2"]
    if attack == "alone":
        attack = None
    options = peer_options(args, args.train_steps, len(honest_names) + bool(attack)) + ["--value-bits", str(value_bits)]
    with LocalSwarm(workdir, swarm="training", config_path=str(config_path)) as local:
        local.start_bootstrap(refresh_period=2)
        hostile = HostileNode(local.swarm, local.initial_peers) if attack else contextlib.nullcontext()
        with local.client() as client, hostile as node:
            if attack == "lying-replies":
                node.serve(LyingSyncReplies(0))
            elif attack:
                windows = load_corpus(None).windows("train", config.seq_len)
                node.serve(HostileReplica(node, config, 0, DeMoConfig(value_bits=value_bits), 2e-3, attack, windows))
            if attack:
                node.announce(0, lifetime_s=3600)
            started = time.monotonic()
            peers = [local.start_peer(name, "0", options) for name in honest_names]
            hung = False
            try:
                wait_for(lambda: len(hosts_of(client, 0)) == len(honest_names), args.timeout, "the honest replicas")
            except WaitTimeout:
                hung = True
            seconds = time.monotonic() - started
            crashed = sum(p.process.poll() not in (None, 0) for p in peers)
        steps = args.train_steps
        blocks = [load_block(local.workdir / n / f"block_0_step_{steps}.safetensors", config, 0)[0] for n in honest_names
                  if (local.workdir / n / f"block_0_step_{steps}.safetensors").exists()]  # fmt: skip
    losses = [block_denoise_ce(b, config, 0, args.windows) for b in blocks]
    return {"attack": attack or ("two honest alone" if len(honest_names) == 2 else "none"), "value_bits": value_bits, "honest_replicas": len(honest_names),
            "finished": len(blocks), "validation_loss": statistics.mean(losses) if losses else None,
            "validation_loss_per_replica": losses, "honest_crashed": crashed, "hung": hung, "seconds": seconds}  # fmt: skip


def part_two(args, workdir: Path) -> dict:
    runs = {}
    for bits in (16, 1):
        for attack in (None, "alone", "negated", "max-values", "random-signs") + (("lying-replies",) if bits == 16 else ()):
            name = f"{attack or 'clean'}_{bits}bit"
            logger.info("training run: %s", name)
            runs[name] = training_run(args, workdir / name, bits, attack)
            clean = runs[f"clean_{bits}bit"]["validation_loss"]
            if attack and runs[name]["validation_loss"] is not None:
                runs[name]["honest_loss_over_clean"] = runs[name]["validation_loss"] / clean
    return runs


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (fetched, trained) = plt.subplots(1, 2, figsize=(13, 4.5))
    one = {k: v.get("denoise_ce_over_clean") for k, v in result["fetch_and_serve"].items() if isinstance(v, dict)}
    names = [k for k, v in one.items() if v is not None]
    fetched.barh(names, [one[k] for k in names])
    fetched.axvline(1.02, color="r", linestyle="--", label="1.02")
    fetched.set(title="fetched model's denoise_ce / clean", xlim=(0.9, max([1.1, *[one[k] for k in names]])))
    fetched.legend()
    two = {k: v.get("honest_loss_over_clean") for k, v in result["training"].items() if v.get("honest_loss_over_clean")}
    trained.barh(list(two), list(two.values()))
    trained.axvline(1.03, color="r", linestyle="--", label="1.03")
    trained.set(title="honest replicas' validation loss / clean 3 replicas", xlim=(0.9, max([1.1, *two.values()])))
    trained.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150, help="training steps of the part-1 swarm")
    parser.add_argument("--train-steps", type=int, default=150, help="steps of each part-2 training run")
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--parts", nargs="+", choices=["1", "2"], default=["1", "2"])
    parser.add_argument("--out", default="benchmarks/results/attacks")
    args = parser.parse_args()
    setup_logging()
    args.windows = load_corpus(None).windows("validation", ModelConfig(**SMALL).seq_len).fixed(VALIDATION_WINDOWS)
    result = {"config": {k: v for k, v in vars(args).items() if k != "windows"}, "model": SMALL}
    with tempfile.TemporaryDirectory() as tmp:
        if "1" in args.parts:
            result["fetch_and_serve"] = part_one(args, Path(tmp) / "one")
        if "2" in args.parts:
            result["training"] = part_two(args, Path(tmp) / "two")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attacks.json").write_text(json.dumps(result, indent=2))
    if "fetch_and_serve" in result and "training" in result:
        plot(result, out / "attacks.png")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
