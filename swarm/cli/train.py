"""swarm-train: train a model on this machine, every block in turn or one block, or a baseline."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from swarm.cli.console import Command, run_command
from swarm.cli.options import checked_text_source
from swarm.errors import SwarmError
from swarm.model.checkpoint import load_block, save_block, save_model_folder
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.train import (
    AUTOREGRESSIVE_LR,
    DENOISER_LR,
    TrainConfig,
    autoregressive_trainer,
    block_trainer,
    checked_device,
    default_lr,
    end_to_end_trainer,
    train,
)

logger = logging.getLogger(__name__)


def block_path(checkpoint_dir: Path, block: int) -> Path:
    return checkpoint_dir / f"block_{block}.safetensors"


def parse_block_choice(value: str, config: ModelConfig) -> list[int]:
    """'all' or a block index, as the list of blocks to train."""
    if value == "all":
        return list(range(config.n_blocks))
    try:
        block = int(value)
    except ValueError:
        raise SwarmError(f"--block must be 'all' or a block index, not {value!r}") from None
    if not 0 <= block < config.n_blocks:
        raise SwarmError(f"block index {block} is out of range: this model has blocks 0..{config.n_blocks - 1}")
    return [block]


@click.command("swarm-train", cls=Command)
@click.option("--out", default="model", show_default=True, help="Model folder to write.")
@click.option("--kind", type=click.Choice(["blocks", "end-to-end", "autoregressive"]), default="blocks",
              show_default=True, help="The blocks one by one (what a swarm trains), or a baseline: the same model "
              "end to end, or an autoregressive transformer.")
@click.option("--block", "block_choice", default="all", show_default=True,
              help="'all', or one block index to train alone.")
@click.option("--checkpoint-dir", default="checkpoints", show_default=True, help="Where block checkpoints go.")
@click.option("--steps", type=click.IntRange(min=1), default=300, show_default=True,
              help="Steps per block (or per baseline).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Windows of text per training step.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None,
              help=f"Peak learning rate (default: {DENOISER_LR} for a denoiser, {AUTOREGRESSIVE_LR} for "
              "autoregressive).")
@click.option("--data", default=None, callback=checked_text_source,
              help="Text file, folder or dataset name (default: built-in Wikipedia corpus).")
@click.option("--config", "config_path", default=None, help="Model config JSON (default: the built-in config).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the initial weights and of the batches and noise drawn: the same seed, the same run.")
@click.option("--device", default="cpu", show_default=True, help="Torch device to train on: cpu, cuda, cuda:1, mps.")
def train_command(out, kind, block_choice, checkpoint_dir, steps, batch_size, lr, data, config_path, seed, device):
    """Train a model on this machine: every block in turn (holding one at a time), or a baseline."""
    checked_device(device)
    config = ModelConfig.from_json_file(config_path)
    blocks = parse_block_choice(block_choice, config) if kind == "blocks" else []
    windows = load_corpus(data).windows("train", config)
    train_config = TrainConfig(steps=steps, batch_size=batch_size, lr=lr or default_lr(kind), seed=seed)
    if kind != "blocks":
        make = end_to_end_trainer if kind == "end-to-end" else autoregressive_trainer
        trainer = train(make(config, windows, train_config, device), steps, kind)
        save_model_folder(Path(out), kind.replace("-", "_"), config, [trainer.module], {"steps": trainer.step_count})
        logger.info("wrote %s", out)
        return
    for block in blocks:
        trainer = train(block_trainer(config, block, windows, train_config, device), steps, f"block {block}")
        save_block(block_path(Path(checkpoint_dir), block), trainer.module, config, block, trainer.step_count)
    if len(blocks) == config.n_blocks:
        loaded = [load_block(block_path(Path(checkpoint_dir), b), config, b) for b in blocks]
        manifest = {"blocks": {str(b): {"step": step} for b, (_, step) in zip(blocks, loaded)}}  # as swarm-fetch's
        save_model_folder(Path(out), "blocks", config, [module for module, _ in loaded], manifest)
        logger.info("wrote %s", out)


def main() -> None:
    run_command(train_command)


if __name__ == "__main__":
    main()
