"""The single-machine commands: swarm-train, swarm-eval, swarm-generate.

Each is a thin click wrapper over the library; `run_command` turns user errors into one
line on stderr.
"""

from __future__ import annotations

import codecs
import json
import logging
import sys
from pathlib import Path

import click
import torch

from swarm.checkpoint import load_block, load_model_folder, save_block, save_model_folder
from swarm.console import run_command
from swarm.data import ByteWindows, load_corpus, load_text_bytes
from swarm.diffusion import local_runner
from swarm.errors import SwarmError
from swarm.evaluate import evaluate_autoregressive, evaluate_denoiser
from swarm.generate import continue_text
from swarm.model import ModelConfig
from swarm.options import swarm_options
from swarm.remote import RemoteBlocks
from swarm.swarm_cli import SwarmClient
from swarm.train import TrainConfig, autoregressive_trainer, block_trainer, end_to_end_trainer, train

logger = logging.getLogger(__name__)


def read_model_config(path: str | None) -> ModelConfig:
    """The model config of a JSON file, or the built-in default when no file is given."""
    if path is None:
        return ModelConfig()
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise SwarmError(f"cannot read model config {path}: {error.strerror}") from None
    except ValueError:
        raise SwarmError(f"model config {path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise SwarmError(f"model config {path} must be a JSON object")
    return ModelConfig.from_dict(data)


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


@click.command("swarm-train")
@click.option("--out", default="model", show_default=True, help="Model folder to write.")
@click.option("--kind", type=click.Choice(["blocks", "end-to-end", "autoregressive"]), default="blocks", show_default=True)
@click.option("--block", "block_choice", default="all", show_default=True, help="'all', or one block index to train alone.")
@click.option("--checkpoint-dir", default="checkpoints", show_default=True, help="Where block checkpoints go.")
@click.option("--steps", type=click.IntRange(min=1), default=300, show_default=True, help="Steps per block (or per baseline).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=2e-3, show_default=True)
@click.option("--data", default=None, help="Text file, folder or dataset name (default: built-in Wikipedia corpus).")
@click.option("--config", "config_path", default=None, help="Model config JSON (default: the built-in config).")
@click.option("--seed", type=int, default=0, show_default=True)
def train_command(out, kind, block_choice, checkpoint_dir, steps, batch_size, lr, data, config_path, seed):
    """Train a model on this machine: every block in turn (holding one at a time), or a baseline."""
    config = read_model_config(config_path)
    blocks = parse_block_choice(block_choice, config) if kind == "blocks" else []
    windows = load_corpus(data).windows("train", config.seq_len)
    train_config = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    if kind != "blocks":
        make = end_to_end_trainer if kind == "end-to-end" else autoregressive_trainer
        trainer = train(make(config, windows, train_config), steps, kind)
        save_model_folder(Path(out), kind.replace("-", "_"), config, [trainer.module])
        logger.info("wrote %s", out)
        return
    for block in blocks:
        trainer = train(block_trainer(config, block, windows, train_config), steps, f"block {block}")
        save_block(block_path(Path(checkpoint_dir), block), trainer.module, config, block, trainer.step_count)
    if len(blocks) == config.n_blocks:
        modules = [load_block(block_path(Path(checkpoint_dir), b), config, b)[0] for b in blocks]
        save_model_folder(Path(out), "blocks", config, modules)
        logger.info("wrote %s", out)


def evaluation_windows(text: str | None, data: str | None, config: ModelConfig, count: int) -> torch.Tensor:
    """Fixed windows of a user's text file, or of the validation split of a source."""
    stream = load_text_bytes(text) if text else load_corpus(data).validation
    return ByteWindows(stream, config.seq_len).fixed(count)


@click.command("swarm-eval")
@click.option("--model", "model_dir", required=True, help="Model folder (config.json, model.safetensors).")
@click.option("--text", default=None, help="Evaluate on this text file or folder instead of the validation split.")
@click.option("--data", default=None, help="Source whose validation split to use (default: built-in corpus).")
@click.option("--judge", default=None, help="Autoregressive model folder that scores generated text (gen_nll).")
@click.option("--windows", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--steps-per-block", type=click.IntRange(min=1), default=1, show_default=True)
def eval_command(model_dir, text, data, judge, windows, steps_per_block):
    """Print the model's figures of quality as JSON."""
    model = load_model_folder(Path(model_dir))
    judge_model = load_model_folder(Path(judge)) if judge else None
    if judge_model is not None and judge_model.kind != "autoregressive":
        raise SwarmError(f"--judge must be an autoregressive model folder, {judge} holds {judge_model.kind}")
    batch = evaluation_windows(text, data, model.config, windows)
    if model.kind == "autoregressive":
        figures = evaluate_autoregressive(model.modules[0], model.config, batch)
    else:
        judge_module = judge_model.modules[0] if judge_model else None
        figures = evaluate_denoiser(model.denoiser_for_block, model.config, batch, steps_per_block, judge_module)
    click.echo(json.dumps({"model": model_dir, "kind": model.kind, "windows": windows, **figures}, indent=2))


@click.command("swarm-generate")
@swarm_options
@click.option("--model", "model_dir", default=None, help="Model folder; or --initial-peers to run on the swarm's peers.")
@click.argument("prompt")
@click.option("--max-bytes", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--steps-per-block", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def generate_command(model_dir, prompt, max_bytes, steps_per_block, temperature, seed, **swarm_kwargs):
    """Write the continuation of PROMPT, one span of G bytes per pass through the blocks."""
    if (model_dir is None) == (not swarm_kwargs["initial_peers"]):
        raise SwarmError("give either --model DIR (run here) or --initial-peers ... (run on the swarm's peers)")
    settings = dict(max_bytes=max_bytes, steps_per_block=steps_per_block, temperature=temperature, seed=seed)
    if model_dir is not None:
        model = load_model_folder(Path(model_dir))
        if model.kind == "autoregressive":
            raise SwarmError("swarm-generate needs a block or end-to-end model, not an autoregressive one")
        write_continuation(local_runner(model.denoiser_for_block, model.config), model.config, prompt, settings)
        return
    with SwarmClient(swarm_kwargs) as client:
        config = client.directory.wait_for_model(15)
        runner = RemoteBlocks(client.directory, client.p2p, client.loop, config)
        write_continuation(runner, config, prompt, settings)


def write_continuation(run_block, config: ModelConfig, prompt: str, settings: dict) -> None:
    """Stream the continuation to stdout span by span, decoding UTF-8 across span boundaries."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for span in continue_text(run_block, config, prompt.encode(), **settings):
        sys.stdout.write(decoder.decode(span))
        sys.stdout.flush()
    sys.stdout.write(decoder.decode(b"", final=True) + "\n")


def train_main() -> None:
    run_command(train_command)


def eval_main() -> None:
    run_command(eval_command)


def generate_main() -> None:
    run_command(generate_command)
