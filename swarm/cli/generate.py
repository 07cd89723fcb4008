"""swarm-generate: continue a prompt, with a model folder here or through the swarm's peers."""

from __future__ import annotations

import codecs
import logging
import sys
from pathlib import Path

import click

from swarm.checkpoints.choice import SpotCheck
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
from swarm.model.checkpoint import load_model_folder
from swarm.model.denoiser import ModelConfig
from swarm.model.families import local_runner
from swarm.model.generate import continue_text
from swarm.model.steps import MAX_TEMPERATURE, BlockRunner, Sampling
from swarm.p2p.client import SwarmClient
from swarm.p2p.directory import DHTUnavailable
from swarm.p2p.ledger import Witness, publish
from swarm.serving.remote import RemoteBlocks

logger = logging.getLogger(__name__)

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
    default=0.0,
    show_default=True,
    help="0 takes the most likely byte.",
)
@reveal_option
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the noise and of the draws (--temperature above 0, --reveal random): the same seed, the "
              "same text.")
@click.option("--data", default=None, callback=checked_text_source,
              help="The swarm's training text (default: the built-in corpus): its held-out windows measure a block's "
                   "checkpoint before it is used when only one key serves it.")  # fmt: skip
def generate_command(model_dir, prompt, max_bytes, steps_per_block, temperature, reveal, seed, data, **swarm_kwargs):
    """Write the continuation of PROMPT, one span of G bytes per pass through the blocks."""
    if (model_dir is None) == (not swarm_kwargs["initial_peers"]):
        raise SwarmError("give either --model DIR (run here) or --initial-peers ... (run on the swarm's peers)")
    sampling = Sampling(temperature, reveal)
    settings = {"max_bytes": max_bytes, "steps_per_block": steps_per_block, "sampling": sampling, "seed": seed}
    if model_dir is not None:
        model = load_model_folder(Path(model_dir))
        if model.kind == "autoregressive":
            raise SwarmError("swarm-generate needs a block or end-to-end model, not an autoregressive one")
        write_continuation(local_runner(model.denoiser_for_block, model.config), model.config, prompt, settings)
        return
    with swarm_client(swarm_kwargs) as client:
        config = client.wait_for_model(MODEL_TIMEOUT_S)
        spot_check = SpotCheck.from_source(data, config) if data is not None else None  # None: loaded when needed
        runner = RemoteBlocks(client.directory, client.p2p, client.loop, config, spot_check=spot_check,
                              witness=client.witness())  # fmt: skip
        try:
            write_continuation(runner, config, prompt, settings)
        finally:  # the answers other keys confirmed, into the ledger (swarm/p2p/ledger.py)
            attest(client, runner.witness)


def attest(client: SwarmClient, witness: Witness) -> None:
    """Store the client's attestation of the answers it saw confirmed; a DHT that does not answer loses it."""
    try:
        publish(client.directory, witness, wait=True)
    except DHTUnavailable as error:
        logger.warning("the attestation of the answers checked was not stored: %s", error)


def write_continuation(run_block: BlockRunner, config: ModelConfig, prompt: str, settings: dict) -> None:
    """Stream the continuation to stdout span by span, decoding UTF-8 across span boundaries."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for span in continue_text(run_block, config, prompt.encode(), **settings):
        sys.stdout.write(decoder.decode(span))
        sys.stdout.flush()
    sys.stdout.write(decoder.decode(b"", final=True) + "\n")


def main() -> None:
    run_command(generate_command)


if __name__ == "__main__":
    main()
