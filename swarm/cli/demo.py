"""swarm-demo: a whole swarm on this machine, from nothing to generated text.

Starts a bootstrap node and one peer per block (or `--replicas` peers per block, kept in step
by DeMo, which then attest each other's work: swarm/p2p/ledger.py) as separate processes on
127.0.0.1, lets each peer train its block for --steps steps on the built-in corpus, fetches the assembled
model from the swarm as any user would (swarm-fetch), evaluates it, prints a continuation,
and stops every process it started. While the swarm runs, its health page (swarm-health)
is up at the address the demo prints.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click
from tqdm import tqdm

from swarm.cli.console import run_command
from swarm.errors import SwarmError
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_model_folder
from swarm.model.data import load_corpus
from swarm.model.families import local_runner
from swarm.model.evaluate import evaluate_denoiser
from swarm.model.generate import continue_text
from swarm.p2p.directory import SwarmDirectory
from swarm.waiting import wait_for

logger = logging.getLogger(__name__)

SWARM = "demo"


def wait_until_trained(local: LocalSwarm, directory: SwarmDirectory, n_blocks: int, steps: int, timeout: float) -> None:
    """Show the swarm's progress until every block is served at `steps`; SwarmError if a peer dies."""
    with tqdm(total=n_blocks * steps, desc="swarm training", unit="step") as bar:

        def trained() -> bool:
            local.check_running()
            hosts = directory.all_hosts(n_blocks)
            bar.update(sum(max((h.announcement.step for h in hs), default=0) for hs in hosts.values()) - bar.n)
            return directory.every_block_served(n_blocks)

        wait_for(trained, timeout, f"{steps} steps per block", interval=2.0)


@click.command("swarm-demo")
@click.option("--workdir", default="demo", show_default=True, help="Folder for logs, checkpoints and the model.")
@click.option("--steps", type=click.IntRange(min=1), default=100, show_default=True, help="Steps each peer trains.")
@click.option("--config", "config_path", default=None, help="Model config JSON (default: the built-in config).")
@click.option("--data", default=None, help="Text source for the peers (default: built-in corpus).")
@click.option("--prompt", default="The history of", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=10), default=1800.0, show_default=True)
@click.option("--replicas", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Peers per block; more than one keep their block in step (--sync demo).")  # fmt: skip
@click.option("--health-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port of the swarm's health page (0: any free one; its address is printed).")  # fmt: skip
def demo_command(workdir, steps, config_path, data, prompt, timeout, replicas, health_port):
    """Run a demo swarm on this machine: train, fetch, evaluate, generate, stop."""
    workdir = Path(workdir).resolve()
    config_path = str(Path(config_path).resolve()) if config_path else None
    data = str(Path(data).resolve()) if data and Path(data).exists() else data
    with LocalSwarm(workdir, swarm=SWARM, config_path=config_path, data=data) as local:
        initial_peers = local.start_bootstrap()
        logger.info("bootstrap is up: --initial-peers %s", " ".join(initial_peers))
        health = local.start_health(["--port", str(health_port), "--poll-period", "2"])  # up while the swarm is
        click.echo(f"swarm health page: {health}")
        with local.client() as client:
            config = client.directory.wait_for_model(30)
            extra = ["--max-steps", str(steps), "--save-every", str(max(1, steps // 4)), "--announce-period", "3"]
            # one peer per block has no replica to sync with
            extra += ["--sync", "demo", "--wait-for-replicas", str(replicas)] if replicas > 1 else ["--sync", "none"]
            for block in range(config.n_blocks):
                for replica in range(replicas):
                    name = f"peer{block}" + (chr(ord("a") + replica) if replicas > 1 else "")
                    local.start_peer(name, str(block), [*extra, "--public-name", name])
            wait_until_trained(local, client.directory, config.n_blocks, steps, timeout)
        fetched = local.run("swarm-fetch", "--out", str(workdir / "model"))
        if fetched.returncode != 0:
            raise SwarmError(f"swarm-fetch failed: {fetched.stderr.strip().splitlines()[-1:]}")
    report(workdir / "model", data, prompt)


def report(model_dir: Path, data: str | None, prompt: str) -> None:
    """Evaluate the fetched model and print its figures and a continuation of the prompt."""
    model = load_model_folder(model_dir)
    windows = load_corpus(data).windows("validation", model.config.seq_len).fixed(128)
    figures = evaluate_denoiser(model.denoiser_for_block, model.config, windows, steps_per_block=4)
    click.echo(json.dumps({"model": str(model_dir), "manifest": model.manifest, **figures}, indent=2))
    run_block = local_runner(model.denoiser_for_block, model.config)
    spans = continue_text(run_block, model.config, prompt.encode(), 64, steps_per_block=4)
    click.echo(f"{prompt}|{b''.join(spans).decode('utf-8', errors='replace')}")


def main() -> None:
    run_command(demo_command)
