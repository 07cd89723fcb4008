"""swarm-eval: the figures of quality of a model folder, as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from swarm.cli.console import Command, run_command
from swarm.cli.options import checked_text_source, reveal_option, steps_per_block_option
from swarm.errors import SwarmError
from swarm.model.checkpoint import load_model_folder
from swarm.model.data import Windows, load_corpus, load_text_units
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import evaluate_autoregressive, evaluate_denoiser
from swarm.model.steps import Sampling
from swarm.model.words import vocabulary


def evaluation_windows(text: str | None, data: str | None, config: ModelConfig, count: int) -> torch.Tensor:
    """Fixed windows of a user's text file, or of the validation split of a source."""
    stream = load_text_units(text, config.units()) if text else load_corpus(data).stream("validation", config.units())
    return Windows(stream, config.seq_len).fixed(count)


@click.command("swarm-eval", cls=Command)
@click.option("--model", "model_dir", required=True, help="Model folder (config.json, model.safetensors).")
@click.option("--text", default=None, callback=checked_text_source,
              help="Evaluate on this text file or folder instead of the validation split.")
@click.option("--data", default=None, callback=checked_text_source,
              help="Source whose validation split to use, and whose training split's words "
              "count as real words (default: built-in corpus).")
@click.option("--judge", default=None, help="Autoregressive model folder that scores generated text (gen_nll).")
@click.option("--windows", type=click.IntRange(min=1), default=256, show_default=True,
              help="How many fixed windows of the text to score (more: steadier figures, slower).")
@steps_per_block_option
@reveal_option
def eval_command(model_dir, text, data, judge, windows, steps_per_block, reveal):
    """Print the model's figures of quality as JSON."""
    model = load_model_folder(Path(model_dir))
    judge_model = load_model_folder(Path(judge)) if judge else None
    if judge_model is not None and judge_model.kind != "autoregressive":
        raise SwarmError(f"--judge must be an autoregressive model folder, {judge} holds {judge_model.kind}")
    batch = evaluation_windows(text, data, model.config, windows)
    known = vocabulary(load_corpus(data).train)  # what counts as a real word: the training text's words
    if model.kind == "autoregressive":
        figures = evaluate_autoregressive(model.modules[0], model.config, batch, known)
    else:
        judge_module = judge_model.modules[0] if judge_model else None
        figures = evaluate_denoiser(model.denoiser_for_block, model.config, batch, steps_per_block, judge_module, known,
                                    Sampling(reveal=reveal))
    click.echo(json.dumps({"model": model_dir, "kind": model.kind, "windows": windows, **figures}, indent=2))


def main() -> None:
    run_command(eval_command)


if __name__ == "__main__":
    main()
