"""swarm-fetch: assemble the model from the swarm's blocks into a model folder."""

from __future__ import annotations

from pathlib import Path

import click

from swarm.checkpoints.assemble import assemble
from swarm.checkpoints.choice import SpotCheck
from swarm.cli.console import Command, run_command
from swarm.cli.options import checked_text_source, member_options, swarm_client, swarm_options


@click.command("swarm-fetch", cls=Command)
@swarm_options
@member_options
@click.option("--out", required=True, help="Model folder to write (config.json, model.safetensors, manifest.json).")
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="Seconds to wait for the swarm's model record (its creator's) before giving up.")
@click.option("--data", default=None, callback=checked_text_source,
              help="The swarm's training text (default: the built-in corpus): its held-out windows spot-check "
              "each block.")
@click.option("--eval-text", default=None, callback=checked_text_source,
              help="A text file or folder of your own whose windows join the spot check: no host can have tuned a "
                   "block to it.")  # fmt: skip
def fetch_command(out, model_timeout, data, eval_text, **kwargs):
    """Assemble the model from the swarm: for every block, the checkpoint its hosts agree on
    that verifies and passes a spot check of its quality (see swarm/checkpoints/choice.py)."""
    with swarm_client(kwargs) as client:
        config = client.wait_for_model(model_timeout)
        assemble(client, config, Path(out), SpotCheck.from_source(data, config, eval_text=eval_text))
    click.echo(f"wrote {out}")


def main() -> None:
    run_command(fetch_command)


if __name__ == "__main__":
    main()
