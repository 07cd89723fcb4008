"""swarm-health: a web page that follows one swarm (swarm/health/), as Petals' health monitor does."""

from __future__ import annotations

import click

from swarm.cli.console import Command, run_command
from swarm.cli.options import member_options, swarm_client, swarm_options
from swarm.health.app import listen, serve
from swarm.health.state import SwarmMonitor


@click.command("swarm-health", cls=Command)
@swarm_options
@member_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the page listens on (0.0.0.0: all).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port of the page (0: any free one; the address is printed).")  # fmt: skip
@click.option("--poll-period", type=click.FloatRange(min=0.2), default=5.0, show_default=True,
              help="Seconds between two reads of the swarm (the page refreshes as often).")  # fmt: skip
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="Seconds to wait for the swarm's model record (its creator's) before giving up.")
def health_command(host, port, poll_period, model_timeout, **kwargs):
    """Serve a page (and GET /api/v1/state) showing which blocks are healthy, their hosts, loss
    against time and the round trips between peers; prints the page's address; runs until stopped."""
    sock = listen(host, port)  # first: a port in use is one line before anything joins the swarm
    with sock, swarm_client(kwargs) as client:
        config = client.directory.wait_for_model(model_timeout)
        monitor = SwarmMonitor(client.directory, client.p2p, client.run, config)
        serve(monitor, sock, poll_period, on_ready=click.echo)


def main() -> None:
    run_command(health_command)


if __name__ == "__main__":
    main()
