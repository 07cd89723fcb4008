"""Churn: a swarm that loses a random peer every few seconds, against the same swarm left calm.

Both runs start a bootstrap node and two peers per block of a small model on 127.0.0.1
(separate processes), every peer training to the same --max-steps. In the chaos run, for
--duration seconds a random peer is killed (SIGKILL or SIGTERM) every --kill-every seconds
and another started in its place (see `swarm.lab.chaos`), while `swarm-fetch` runs now and then.
Then the swarm finishes its steps, the model is fetched and scored (denoise_ce on validation
windows), beside the calm run's. Prints JSON: peers killed, restarts, fetches tried and
succeeded, steps lost, blocks lost, torn checkpoints, hangs, and both qualities.

    python benchmarks/chaos.py --duration 180 --kill-every 6 --max-steps 400
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from swarm.cli.console import setup_logging
from swarm.files import write_atomic
from swarm.lab.chaos import ChaosConfig, ChaosMonkey
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_model_folder
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import denoise_ce
from swarm.p2p.directory import SwarmDirectory
from swarm.serving.remote import RemoteBlocks
from swarm.waiting import wait_for

logger = logging.getLogger("benchmarks.chaos")

SMALL = {"prefix_len": 32, "gen_len": 16, "d_model": 64, "n_heads": 2, "n_layers": 4, "n_blocks": 2}
VALIDATION_WINDOWS = 256


def run(args, workdir: Path, chaos: bool) -> dict:
    workdir.mkdir(parents=True)
    config_path = workdir / "small.json"
    config_path.write_text(json.dumps(SMALL))
    swarm = "chaosbench" if chaos else "calmbench"
    extra = ["--max-steps", str(args.max_steps), "--save-every", "10", "--announce-period", "1",
             "--sync", "demo", "--sync-deadline", "2", "--batch-size", "16"]  # fmt: skip
    with LocalSwarm(workdir, swarm=swarm, config_path=str(config_path)) as local:
        local.start_bootstrap(refresh_period=2)
        with local.client() as client:
            runner = RemoteBlocks(client.directory, client.p2p, client.loop, client.wait_for_model(30), ping_timeout=2)
            plan = ChaosConfig(args.duration, args.kill_every, args.fetch_every, peer_extra=extra, seed=args.seed)
            monkey = ChaosMonkey(local, runner, plan)
            monkey.start_peers()
            started = time.monotonic()
            if chaos:
                monkey.run()
            wait_until_served(client.directory, SMALL["n_blocks"], args.max_steps, args.timeout)
            monkey.check_checkpoints()
            report = monkey.report() if chaos else {}
            seconds = time.monotonic() - started
        fetched = local.run("swarm-fetch", "--out", "final", timeout=300)
        if fetched.returncode != 0:
            raise RuntimeError(f"final fetch failed: {fetched.stderr}")
        model = load_model_folder(workdir / "final")
    windows = load_corpus(None).windows("validation", model.config).fixed(VALIDATION_WINDOWS)
    quality = denoise_ce(model.denoiser_for_block, model.config, windows)
    return {**report, "seconds_to_finish": seconds, "denoise_ce": quality["overall"],
            "denoise_ce_per_block": quality["per_block"]}


def wait_until_served(directory: SwarmDirectory, n_blocks: int, steps: int, timeout: float) -> None:
    def finished() -> bool:
        hosts = directory.all_hosts(n_blocks)
        return all(any(h.announcement.state == "serving" and h.announcement.step >= steps for h in hs)
                   for hs in hosts.values())

    wait_for(finished, timeout, f"{steps} steps per block", interval=2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of churn")
    parser.add_argument("--kill-every", type=float, default=6.0)
    parser.add_argument("--fetch-every", type=float, default=20.0)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", default="benchmarks/results/chaos")
    args = parser.parse_args()
    setup_logging()
    with tempfile.TemporaryDirectory() as tmp:
        calm = run(args, Path(tmp) / "calm", chaos=False)
        churn = run(args, Path(tmp) / "chaos", chaos=True)
    result = {
        "config": vars(args),
        "model": ModelConfig(**SMALL).to_dict(),  # its units too (a file without them predates tokens)
        "calm": calm,
        "chaos": churn,
        "denoise_ce_chaos_over_calm": churn["denoise_ce"] / calm["denoise_ce"],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "chaos.json", json.dumps(result, indent=2).encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
