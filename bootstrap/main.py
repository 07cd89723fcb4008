"""swarm-bootstrap: a long-running DHT entry point, and the creator of a new swarm.

Option parsing only: the node itself is `swarm.p2p.bootstrap.run_bootstrap`.
"""

from __future__ import annotations

import click

from swarm.cli.console import run_command
from swarm.cli.options import network_options, swarm_options
from swarm.model.denoiser import ModelConfig
from swarm.p2p.bootstrap import BootstrapConfig, run_bootstrap

DEFAULT_IDENTITY = "bootstrap.id"  # a stable peer id (and so stable addresses) across restarts


@click.command("swarm-bootstrap")
@swarm_options
@click.option("--new-swarm", is_flag=True, help="Create the swarm: publish its model config as <swarm>.model, signed.")
@click.option("--config", "config_path", default=None, help="Model config JSON for --new-swarm (default: built-in).")
@click.option("--creator-key", default=BootstrapConfig.creator_key, show_default=True,
              help="With --new-swarm: the RSA key that signs the model record (created on first use); keep it to "
              "stay the swarm's creator across restarts.")
@click.option("--refresh-period", type=click.FloatRange(min=1), default=BootstrapConfig.refresh_period, show_default=True,
              help="Seconds between re-publishing the model config and logging the swarm's size.")
def bootstrap_command(new_swarm, config_path, creator_key, refresh_period, **kwargs):
    """Run a stable DHT entry point; print the options others join with on one line."""
    swarm, creator = kwargs.pop("swarm"), kwargs.pop("creator")
    network = network_options(kwargs)
    if network.identity_path is None:
        network.identity_path = DEFAULT_IDENTITY
    model = ModelConfig.from_json_file(config_path) if new_swarm else None
    config = BootstrapConfig(swarm, network, creator, model, creator_key, refresh_period)
    run_bootstrap(config, on_ready=click.echo)  # echo flushes: the lab reads the line as it comes


def main() -> None:
    run_command(bootstrap_command)
