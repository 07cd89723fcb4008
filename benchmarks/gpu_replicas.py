"""Whole peers on one device: two DeMo replicas of a block and a peer of another, as processes (issue 47).

Starts a bootstrap and three `swarm-peer --device DEVICE` processes on 127.0.0.1 (the lab's
`LocalSwarm`), all of a small model of two blocks: r0 and r1 host block 0 and keep in step with
`--sync demo`, r2 hosts block 1 alone. They train --steps steps, sync, save and serve. Then it
checks what a user of such a swarm relies on, the device assumed nowhere:
- r0's and r1's checkpoints of the last step are bit-identical (DeMo replicas that applied the
  same payloads compute the same step, on the device too);
- `swarm-fetch` assembles the model, and each fetched block equals the checkpoint its host saved;
- the swarm writes, through its peers, what the fetched model writes here for the same seed.

Writes gpu_replicas.json under --out as it goes (each check as it is made), and exits non-zero if a
check fails. With --device cpu it is the same run on the CPU, a smoke check of the script; on a
GPU machine it runs from benchmarks/gpu/sync.sh.

    python benchmarks/gpu_replicas.py --device cuda
    python benchmarks/gpu_replicas.py --device cpu --steps 6 --out /tmp/replicas   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

import swarm
from swarm.cli.console import setup_logging
from swarm.errors import SwarmError
from swarm.files import write_atomic
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_block
from swarm.model.denoiser import ModelConfig

logger = logging.getLogger("benchmarks.gpu_replicas")

PROMPT = "The history of"
TRAINED_TIMEOUT_S = 900.0


def small_config() -> ModelConfig:
    """Two blocks of the built-in units, small enough to train in a minute anywhere."""
    return ModelConfig(d_model=128, n_heads=4, n_layers=4, n_blocks=2)


def wait_for_checkpoints(paths: list[Path], local: LocalSwarm, timeout: float) -> None:
    """Until every path exists; SwarmError if a process exited or the time ran out."""
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        local.check_running()
        if time.monotonic() > deadline:
            missing = ", ".join(str(p) for p in paths if not p.exists())
            raise SwarmError(f"no checkpoint after {timeout:.0f} s: {missing}")
        time.sleep(1.0)


def identical(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def run(args: argparse.Namespace, workdir: Path, result: dict, save) -> None:
    """The swarm, its checks, each written into `result` (and saved) as it is made."""
    config = small_config()
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config.to_dict()))
    common = ["--device", args.device, "--max-steps", str(args.steps), "--save-every", str(args.steps),
              "--batch-size", str(args.batch_size), "--announce-period", "1"]  # fmt: skip
    demo = ["--sync", "demo", "--wait-for-replicas", "2", "--sync-deadline", "30"]
    with LocalSwarm(workdir, swarm="gpureplicas", config_path=str(config_path)) as local:
        local.start_bootstrap()
        local.start_peer("r0", "0", [*common, *demo])
        local.start_peer("r1", "0", [*common, *demo])
        local.start_peer("r2", "1", [*common, "--sync", "none"])
        saved = {name: local.checkpoint_dir(name) / f"block_{block}_step_{args.steps}.safetensors"
                 for name, block in (("r0", 0), ("r1", 0), ("r2", 1))}  # fmt: skip
        started = time.monotonic()
        wait_for_checkpoints(list(saved.values()), local, TRAINED_TIMEOUT_S)
        result["trained_seconds"] = time.monotonic() - started
        blocks = {name: load_block(path, config, int(path.name.split("_")[1]))[0] for name, path in saved.items()}
        result["replicas_identical"] = identical(blocks["r0"], blocks["r1"])
        save()
        join_line = " ".join(local.join_args)
        with swarm.connect(join_line) as remote:
            fetched = remote.fetch(workdir / "model")
            result["fetched_equals_checkpoints"] = all(
                identical(fetched.loaded.modules[block], blocks[name]) for block, name in ((0, "r0"), (1, "r2"))
            )
            save()
            through_peers = remote.generate(PROMPT, max_bytes=args.gen_bytes, seed=1)
        here = fetched.generate(PROMPT, max_bytes=args.gen_bytes, seed=1)
        result["generation"] = {"through_peers": through_peers, "here": here, "equal": through_peers == here}
        save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="where every peer trains and serves: cuda, cuda:1, cpu")
    parser.add_argument("--steps", type=int, default=40, help="steps each peer trains (and saves at)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--gen-bytes", type=int, default=64)
    parser.add_argument("--out", default="/tmp/gpu-sync/replicas")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    setup_logging()
    result: dict = {"settings": vars(args), "model": small_config().to_dict()}
    out = Path(args.out) / "gpu_replicas.json"

    def save() -> None:
        write_atomic(out, json.dumps(result, indent=2).encode())

    try:
        with tempfile.TemporaryDirectory() as tmp:
            run(args, Path(tmp), result, save)
    except SwarmError as error:
        result["error"] = str(error)
        save()
        sys.exit(f"gpu_replicas.py: error: {error}")
    print(json.dumps(result, indent=2))
    checks = (result["replicas_identical"], result["fetched_equals_checkpoints"], result["generation"]["equal"])
    if not all(checks):
        sys.exit("gpu_replicas.py: error: a check failed (see the JSON above)")


if __name__ == "__main__":
    main()
