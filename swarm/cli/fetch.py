"""swarm-fetch: assemble the model from the swarm's blocks into a model folder."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from swarm.checkpoints.choice import Choice, SpotCheck, choose_checkpoint, rank
from swarm.cli.console import Command, run_command
from swarm.cli.options import checked_text_source, member_options, swarm_client, swarm_options
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block, save_model_folder
from swarm.model.denoiser import ModelConfig

logger = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 600.0


@click.command("swarm-fetch", cls=Command)
@swarm_options
@member_options
@click.option("--out", required=True, help="Model folder to write (config.json, model.safetensors, manifest.json).")
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="Seconds to wait for the swarm's model record (its creator's) before giving up.")
@click.option("--data", default=None, callback=checked_text_source,
              help="The swarm's training text (default: the built-in corpus): its held-out windows spot-check each block.")
def fetch_command(out, model_timeout, data, **kwargs):
    """Assemble the model from the swarm: for every block, the checkpoint its hosts agree on
    that verifies and passes a spot check of its quality (see swarm/checkpoints/choice.py)."""
    with swarm_client(kwargs) as client:
        config = client.wait_for_model(model_timeout)
        hosts = client.directory.all_hosts(config.n_blocks)
        missing = [b for b, h in hosts.items() if not rank(h, config)]
        if missing:
            raise SwarmError(f"no live host with a checkpoint for block(s) {', '.join(map(str, missing))}")
        spot_check = SpotCheck.from_source(data, config)
        modules, manifest = [], {"swarm": client.swarm, "config_hash": config.hash(), "blocks": {}}
        for block in range(config.n_blocks):
            choice = choose_block(client, config, block, spot_check)
            modules.append(decode_block(choice.data, config, block)[0])
            manifest["blocks"][str(block)] = manifest_entry(choice)
        manifest["spot_check_seconds"] = spot_check.seconds
        save_model_folder(Path(out), "blocks", config, modules, manifest)
    click.echo(f"wrote {out}")


def choose_block(client, config: ModelConfig, block: int, spot_check: SpotCheck) -> Choice:
    """The checkpoint to assemble for `block`, chosen from its hosts' records as they are now.

    Records are read again for each block, and once more if no candidate could be had: hosts
    keep a checkpoint only a while after a newer one replaces it in their record, and spot
    checks of the blocks before take minutes on a busy machine, so records read at the start
    may name checkpoints that are gone (seen in benchmarks/long_run.py)."""

    def choose() -> Choice:
        hosts = client.directory.hosts(block)
        coro = choose_checkpoint(client.p2p, hosts, config, block, spot_check, keys_count=client.directory.keys_count)
        return client.run(coro, FETCH_TIMEOUT_S)

    try:
        return choose()
    except SwarmError as error:
        logger.warning("%s; reading block %d's records again", error, block)
    return choose()


def manifest_entry(choice: Choice) -> dict:
    return {
        "peer_id": choice.host.peer_id,
        "public_name": choice.host.announcement.public_name,
        "step": choice.checkpoint.step,
        "sha256": choice.checkpoint.sha256,
        "vouched_by": sorted(h.peer_id for h in choice.chosen.candidate.hosts),
        "spot_check_loss": choice.loss,
        "candidates_measured": len(choice.measured),
    }


def main() -> None:
    run_command(fetch_command)


if __name__ == "__main__":
    main()
