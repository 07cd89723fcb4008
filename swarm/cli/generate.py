"""swarm-generate: continue a prompt, with a model folder here or through the swarm's peers."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

from swarm.api import Swarm, load
from swarm.cli.console import Command, run_command
from swarm.cli.options import (
    checked_text_source,
    member_options,
    reveal_option,
    steps_per_block_option,
    swarm_client,
    swarm_options,
)
from swarm.errors import SwarmError
from swarm.model.steps import DEFAULT_TEMPERATURE, MAX_TEMPERATURE

MODEL_TIMEOUT_S = 15.0


@click.command("swarm-generate", cls=Command)
@swarm_options
@member_options
@click.option(
    "--model", "model_dir", default=None, help="Model folder; or --initial-peers to run on the swarm's peers."
)
@click.argument("prompt")
@click.option("--max-bytes", type=click.IntRange(min=1), default=128, show_default=True,
              help="The longest continuation to write, in bytes.")
@steps_per_block_option
@click.option(
    "--temperature",
    type=click.FloatRange(min=0, max=MAX_TEMPERATURE),
    default=DEFAULT_TEMPERATURE,
    show_default=True,
    help="0 takes the most likely unit (which repeats itself); above 0, draws from the softened logits.",
)
@reveal_option
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the noise and of the draws (--temperature above 0, --reveal random): the same seed, the "
              "same text.")
@click.option("--data", default=None, callback=checked_text_source,
              help="The swarm's training text (default: the built-in corpus): its held-out windows measure a block's "
                   "checkpoint before it is used when only one key serves it.")  # fmt: skip
@click.option("--eval-text", default=None, callback=checked_text_source,
              help="A text file or folder of your own whose windows join that measurement: no host can have tuned a "
                   "block to it.")  # fmt: skip
@click.option("--run-block", "run_blocks", multiple=True, type=click.IntRange(min=0),
              help="A block to be sure of (repeatable): run it here from its checkpoint's verified file, asking "
                   "none of its hosts. Costs one download, then the block's steps for every span on this "
                   "machine.")  # fmt: skip
def generate_command(model_dir, prompt, max_bytes, steps_per_block, temperature, reveal, seed, data, eval_text,
                     run_blocks, **swarm_kwargs):  # fmt: skip
    """Write the continuation of PROMPT, one span of G units per pass through the blocks."""
    if (model_dir is None) == (not swarm_kwargs["initial_peers"]):
        raise SwarmError("give either --model DIR (run here) or --initial-peers ... (run on the swarm's peers)")
    if model_dir is not None and run_blocks:
        raise SwarmError("--run-block is for --initial-peers: with --model every block runs here")
    settings = {"max_bytes": max_bytes, "steps_per_block": steps_per_block, "temperature": temperature,
                "reveal": reveal, "seed": seed}  # fmt: skip
    if model_dir is not None:
        write(load(model_dir).stream(prompt, **settings))
        return
    with Swarm(swarm_client(swarm_kwargs), data, MODEL_TIMEOUT_S, eval_text, run_blocks) as remote:
        write(remote.stream(prompt, **settings))


def write(pieces: Iterator[str]) -> None:
    """Stream the continuation to stdout as each pass through the blocks writes it."""
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def main() -> None:
    run_command(generate_command)


if __name__ == "__main__":
    main()
