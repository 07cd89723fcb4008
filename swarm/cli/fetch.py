"""swarm-fetch: assemble the model from the swarm's blocks into a model folder."""

from __future__ import annotations

from pathlib import Path

import click

from swarm.cli.console import run_command
from swarm.cli.options import swarm_client, swarm_options
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block, save_model_folder
from swarm.p2p.directory import Host, freshest_first
from swarm.p2p.transfer import fetch_verified

FETCH_TIMEOUT_S = 600.0


@click.command("swarm-fetch")
@swarm_options
@click.option("--out", required=True, help="Model folder to write (config.json, model.safetensors, manifest.json).")
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True)
def fetch_command(out, model_timeout, **kwargs):
    """Assemble the model from the swarm: the freshest verified checkpoint of every block."""
    with swarm_client(kwargs) as client:
        config = client.directory.wait_for_model(model_timeout)
        hosts = client.directory.all_hosts(config.n_blocks)
        missing = [b for b, h in hosts.items() if not freshest_first(h)]
        if missing:
            raise SwarmError(f"no live host with a checkpoint for block(s) {', '.join(map(str, missing))}")
        modules, manifest = [], {"swarm": client.swarm, "config_hash": config.hash(), "blocks": {}}
        for block in range(config.n_blocks):
            data, host = client.run(fetch_verified(client.p2p, freshest_first(hosts[block]), config, block), FETCH_TIMEOUT_S)
            modules.append(decode_block(data, config, block)[0])
            manifest["blocks"][str(block)] = manifest_entry(host)
        save_model_folder(Path(out), "blocks", config, modules, manifest)
    click.echo(f"wrote {out}")


def manifest_entry(host: Host) -> dict:
    checkpoint = host.announcement.checkpoint
    return {
        "peer_id": host.peer_id,
        "public_name": host.announcement.public_name,
        "step": checkpoint.step,
        "sha256": checkpoint.sha256,
    }


def main() -> None:
    run_command(fetch_command)
