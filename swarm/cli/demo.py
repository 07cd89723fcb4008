"""swarm-demo: a whole swarm on this machine, from a start model to generated text.

Starts a bootstrap node and one peer per block (or `--replicas` peers per block, kept in step
by DeMo, which then attest each other's work: swarm/p2p/ledger.py) as separate processes on
127.0.0.1, lets each peer train its block for --steps steps on the built-in corpus, fetches the
assembled model from the swarm as any user would (swarm-fetch), prints a continuation of the
prompt and then the model's figures, and stops every process it started. While the swarm runs,
its health page (swarm-health) is up at the address the demo prints.

Why a start model: a demo's few minutes on a home computer teach the blocks letter frequencies,
not words. So by default every peer starts from the start model the package ships
(swarm/cli/demo_start: the built-in config's blocks, trained by an earlier demo swarm for
thousands of steps, in bfloat16; its manifest.json says how) and trains on from it, which the
demo says plainly. `--fresh` starts from nothing, `--start` from another model folder, and
`--save-start` writes this run's model as a start model for later ones (how the shipped one was made).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import click
import torch
from tqdm import tqdm

from swarm.checkpoints.store import CheckpointStore
from swarm.cli.console import Command, run_command
from swarm.cli.options import checked_text_source
from swarm.errors import SwarmError
from swarm.files import write_atomic
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import LoadedModel, load_model_folder, save_model_folder
from swarm.model.compressors import compressor_bits_per_byte
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import evaluate_denoiser
from swarm.model.families import local_runner
from swarm.model.generate import STEPS_PER_BLOCK, continue_text
from swarm.p2p.directory import SwarmDirectory
from swarm.waiting import wait_for

logger = logging.getLogger(__name__)

SWARM = "demo"
SHIPPED_START = Path(__file__).resolve().parent / "demo_start"  # package data: see its manifest.json
REPORT_WINDOWS = 128  # validation windows the demo scores its model on


@dataclass(frozen=True)
class StartModel:
    """A blocks model folder the demo's peers start from, and the step each block was saved at."""

    folder: Path
    model: LoadedModel
    steps: list[int]

    @classmethod
    def load(cls, folder: Path) -> StartModel:
        """The blocks model in `folder`; SwarmError (one line) if it is none, or names no block steps."""
        model = load_model_folder(folder)
        if model.kind != "blocks":
            raise SwarmError(f"{folder} holds a {model.kind} model, not blocks a swarm can start from")
        try:
            steps = [int(model.manifest["blocks"][str(b)]["step"]) for b in range(model.config.n_blocks)]
        except (TypeError, KeyError, ValueError):
            raise SwarmError(f"{folder} has no manifest.json naming each block's step") from None
        return cls(folder, model, steps)

    def fits(self, config: ModelConfig) -> bool:
        """Whether its blocks are of `config` (the same hash): only then can a swarm of it load them."""
        return self.model.config.hash() == config.hash()

    def seed(self, checkpoint_dir: Path, block: int) -> None:
        """Put the block's weights in a peer's checkpoint folder as its own newest checkpoint, which the
        peer starts from unless a replica serves a fresher one that passes the spot check
        (swarm/checkpoints/choice.py); loading checks it as any checkpoint file: config hash, block, finite."""
        CheckpointStore(checkpoint_dir, self.model.config, block, SWARM).save(
            self.model.modules[block], self.steps[block]
        )


def save_start_model(model_dir: Path, out: Path, made_by: dict) -> None:
    """Write a fetched blocks model as a start model: bfloat16 weights (half the bytes) and a manifest
    of each block's step and how it was made (the fetched hashes and hosts describe other bytes, so
    they are left out). The blocks train on in float32 wherever they are loaded. SwarmError (one
    line) if `out` cannot be written."""
    fetched = StartModel.load(model_dir)
    model, steps = fetched.model, {str(b): {"step": step} for b, step in enumerate(fetched.steps)}
    modules = [module.to(torch.bfloat16) for module in model.modules]
    try:
        save_model_folder(out, model.kind, model.config, modules, {"blocks": steps, "made_by": made_by})
    except OSError as error:
        raise SwarmError(f"cannot write the start model to {out}: {error.strerror}") from None


def choose_start(start: str | None, fresh: bool, config: ModelConfig) -> StartModel | None:
    """The model the peers start from: none with --fresh, the folder --start names (SwarmError if it
    does not fit the swarm's config), else the shipped one when it fits the swarm's config."""
    if fresh:
        return None
    chosen = StartModel.load(Path(start) if start else SHIPPED_START)
    if chosen.fits(config):
        return chosen
    if start:
        raise SwarmError(f"--start {start} was trained for another model config than this swarm's")
    click.echo("the shipped start model was trained for the built-in config, not this one: starting from nothing",
               err=True)  # fmt: skip
    return None


def wait_until_trained(
    local: LocalSwarm, directory: SwarmDirectory, start_steps: list[int], steps: int, timeout: float
) -> None:
    """Show the swarm's progress until every block is served, `steps` past its start; SwarmError if a peer dies."""
    n_blocks = len(start_steps)
    with tqdm(total=n_blocks * steps, desc="swarm training", unit="step") as bar:

        def trained() -> bool:
            local.check_running()
            hosts = directory.all_hosts(n_blocks)
            done = [max((h.announcement.step for h in hosts[b]), default=0) for b in range(n_blocks)]
            bar.update(sum(max(0, d - s) for d, s in zip(done, start_steps)) - bar.n)
            return directory.every_block_served(n_blocks)

        wait_for(trained, timeout, f"{steps} steps per block", interval=2.0)


@click.command("swarm-demo", cls=Command)
@click.option("--workdir", default="demo", show_default=True, help="Folder for logs, checkpoints and the model.")
@click.option("--steps", type=click.IntRange(min=1), default=100, show_default=True, help="Steps each peer trains.")
@click.option("--config", "config_path", default=None, help="Model config JSON (default: the built-in config).")
@click.option("--data", default=None, callback=checked_text_source,
              help="Text source for the peers (default: built-in corpus).")
@click.option("--prompt", default="The history of", show_default=True,
              help="The text the fetched model continues at the end.")
@click.option("--timeout", type=click.FloatRange(min=10), default=1800.0, show_default=True,
              help="Seconds the swarm may take to train every block before the demo gives up.")
@click.option("--replicas", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Peers per block; more than one keep their block in step (--sync demo).")  # fmt: skip
@click.option("--health-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port of the swarm's health page (0: any free one; its address is printed).")  # fmt: skip
@click.option("--fresh", is_flag=True, help="Start every block from nothing, not from the shipped start model.")
@click.option("--start", default=None, help="A blocks model folder to start from instead of the shipped one.")
@click.option("--save-start", default=None, help="Also write the fetched model here as a start model (bfloat16).")
@click.option("--device", default="cpu", show_default=True, help="Where every peer trains (cpu, cuda, cuda:1, mps).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Every peer's batch (default: swarm-peer's).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print every figure as JSON instead of the few lines.")
def demo_command(workdir, steps, config_path, data, prompt, timeout, replicas, health_port, fresh, start, save_start,
                 device, batch_size, as_json):  # fmt: skip
    """Run a demo swarm on this machine: start, train, fetch, generate, evaluate, stop."""
    if fresh and start:
        raise SwarmError("--fresh and --start exclude each other: start from nothing, or from a model")
    made_by = {"command": "swarm-demo", "steps": steps, "replicas": replicas, "data": data or "built-in"}
    workdir = Path(workdir).resolve()
    config_path = str(Path(config_path).resolve()) if config_path else None
    data = str(Path(data).resolve()) if data and Path(data).exists() else data
    start_model = choose_start(start, fresh, ModelConfig.from_json_file(config_path))
    with LocalSwarm(workdir, swarm=SWARM, config_path=config_path, data=data) as local:
        initial_peers = local.start_bootstrap()
        logger.info("bootstrap is up: --initial-peers %s", " ".join(initial_peers))
        health = local.start_health(["--port", str(health_port), "--poll-period", "2"])  # up while the swarm is
        click.echo(f"swarm health page: {health}", err=as_json)  # with --json, stdout holds the JSON alone
        with local.client() as client:
            config = client.wait_for_model(30)
            start_steps = start_model.steps if start_model else [0] * config.n_blocks
            if start_model:
                click.echo(f"every block starts from the start model in {start_model.folder} (steps {start_steps}), "
                           f"not from nothing, and trains {steps} steps on: --fresh starts from nothing",
                           err=as_json)  # fmt: skip
            extra = ["--save-every", str(max(1, steps // 4)), "--announce-period", "3", "--device", device]
            extra += ["--batch-size", str(batch_size)] if batch_size else []
            # one peer per block has no replica to sync with
            extra += ["--sync", "demo", "--wait-for-replicas", str(replicas)] if replicas > 1 else ["--sync", "none"]
            peers = []
            for block in range(config.n_blocks):
                for replica in range(replicas):
                    name = f"peer{block}" + (chr(ord("a") + replica) if replicas > 1 else "")
                    if start_model:
                        start_model.seed(local.checkpoint_dir(name), block)
                    max_steps = ["--max-steps", str(start_steps[block] + steps)]
                    peers.append(local.start_peer(name, str(block), [*extra, *max_steps, "--public-name", name]))
            started = time.monotonic()
            wait_until_trained(local, client.directory, start_steps, steps, timeout)
            made_by["peers"] = {"count": len(peers), "training_seconds": round(time.monotonic() - started, 1),
                                "peak_rss_mb": max(p.peak_rss() or 0 for p in peers) / 1e6}  # fmt: skip
        fetched = local.run("swarm-fetch", "--out", str(workdir / "model"))
        if fetched.returncode != 0:
            raise SwarmError(f"swarm-fetch failed: {fetched.stderr.strip().splitlines()[-1:]}")
    report(workdir / "model", data, prompt, as_json, made_by)
    if save_start:
        started_from = f"{start_model.folder.name} at steps {start_steps}" if start_model else "nothing"
        save_start_model(workdir / "model", Path(save_start), {**made_by, "started_from": started_from})


def report(model_dir: Path, data: str | None, prompt: str, as_json: bool, run: dict) -> None:
    """Print a continuation of the prompt by the fetched model, its bits per byte beside gzip's on the
    same validation text, where it is and what to try next; every figure goes to figures.json beside
    the model folder (and to stdout instead, with --json)."""
    model = load_model_folder(model_dir)
    run_block = local_runner(model.denoiser_for_block, model.config)
    spans = continue_text(run_block, model.config, prompt, 64, steps_per_block=STEPS_PER_BLOCK)
    continuation = b"".join(spans).decode("utf-8", errors="replace")
    corpus = load_corpus(data)
    windows = corpus.windows("validation", model.config).fixed(REPORT_WINDOWS)
    figures = evaluate_denoiser(model.denoiser_for_block, model.config, windows, steps_per_block=STEPS_PER_BLOCK)
    gzip_bits = compressor_bits_per_byte(corpus.raw("validation"))["gzip"]
    everything = {"model": str(model_dir), "prompt": prompt, "continuation": continuation, "run": run,
                  "gzip_bits_per_byte": gzip_bits, "manifest": model.manifest, **figures}  # fmt: skip
    figures_path = model_dir.parent / "figures.json"
    write_atomic(figures_path, json.dumps(everything, indent=2).encode())
    if as_json:
        click.echo(json.dumps(everything, indent=2))
        return
    click.echo(f"{prompt}|{continuation}")
    click.echo(f"bits per byte on {REPORT_WINDOWS} validation windows: {figures['bits_per_byte']['overall']:.3f} "
               f"(gzip -9 on the validation text: {gzip_bits:.3f}; lower is better)")  # fmt: skip
    click.echo(f"model folder: {model_dir} (every figure: {figures_path})")
    click.echo(f'next: swarm-generate --model {model_dir} --max-bytes 200 "Your own prompt"')


def main() -> None:
    run_command(demo_command)


if __name__ == "__main__":
    main()
