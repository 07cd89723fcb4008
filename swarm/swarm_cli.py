"""The commands that ask a swarm without joining it as a trainer: swarm-fetch, swarm-status."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from swarm.checkpoint import decode_block, save_model_folder
from swarm.console import run_command
from swarm.directory import Host, SwarmDirectory, freshest_first
from swarm.errors import SwarmError
from swarm.network import EventLoopThread, start_dht
from swarm.options import network_options, swarm_options
from swarm.transfer import fetch_verified

FETCH_TIMEOUT_S = 600.0


class SwarmClient:
    """A DHT node in client mode plus an event loop for P2P calls; use as a context manager."""

    def __init__(self, kwargs: dict):
        self.swarm = kwargs.pop("swarm")
        self.network = network_options(kwargs)
        self.network.client_mode = True
        if not self.network.initial_peers:
            raise SwarmError("--initial-peers is required: the address printed by swarm-bootstrap")

    def __enter__(self) -> "SwarmClient":
        self.dht = start_dht(self.swarm, self.network)
        self.directory = SwarmDirectory(self.dht, self.swarm)
        self.loop = EventLoopThread()
        self.p2p = self.loop.run(self.dht.replicate_p2p(), 30)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.close(self.p2p)
        self.dht.shutdown()


@click.command("swarm-fetch")
@swarm_options
@click.option("--out", required=True, help="Model folder to write (config.json, model.safetensors, manifest.json).")
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True)
def fetch_command(out, model_timeout, **kwargs):
    """Assemble the model from the swarm: the freshest verified checkpoint of every block."""
    with SwarmClient(kwargs) as client:
        config = client.directory.wait_for_model(model_timeout)
        hosts = client.directory.all_hosts(config.n_blocks)
        missing = [b for b, h in hosts.items() if not freshest_first(h)]
        if missing:
            raise SwarmError(f"no live host with a checkpoint for block(s) {', '.join(map(str, missing))}")
        modules, manifest = [], {"swarm": client.swarm, "config_hash": config.hash(), "blocks": {}}
        for block in range(config.n_blocks):
            coro = fetch_verified(client.p2p, freshest_first(hosts[block]), config, block)
            data, host = client.loop.run(coro, FETCH_TIMEOUT_S)
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


@click.command("swarm-status")
@swarm_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True)
def status_command(as_json, model_timeout, **kwargs):
    """Show which peers host which block: state, step, recent loss, checkpoint age, replica drift."""
    with SwarmClient(kwargs) as client:
        config = client.directory.wait_for_model(model_timeout)
        rows = status_rows(client.directory.all_hosts(config.n_blocks))
    if as_json:
        click.echo(json.dumps({"swarm": client.swarm, "config_hash": config.hash(), "hosts": rows}, indent=2))
        return
    click.echo(f"swarm {client.swarm}: {config.n_blocks} blocks, config {config.hash()[:12]}")
    click.echo(f"{'block':>5}  {'peer':<14} {'name':<16} {'state':<9} {'step':>7} {'loss':>7} {'ckpt age':>9} {'drift':>8}")
    for row in rows:
        age = f"{row['checkpoint_age_s']:.0f}s" if row["checkpoint_age_s"] is not None else "-"
        loss = f"{row['loss']:.3f}" if row["loss"] is not None else "-"
        drift = f"{row['drift']:.2e}" if row.get("drift") is not None else "-"
        click.echo(
            f"{row['block']:>5}  {row['peer_id'][-12:]:<14} {row['public_name'][:16]:<16} {row['state']:<9} "
            f"{row['step']:>7} {loss:>7} {age:>9} {drift:>8}"
        )


def status_rows(hosts_by_block: dict[int, list[Host]]) -> list[dict]:
    rows, now = [], time.time()
    for block, hosts in hosts_by_block.items():
        if not hosts:
            rows.append({"block": block, "peer_id": "(none)", "public_name": "", "state": "-", "step": 0,
                         "loss": None, "checkpoint_step": None, "checkpoint_age_s": None})
        for host in hosts:
            a = host.announcement
            rows.append({
                "block": block, "peer_id": a.peer_id, "public_name": a.public_name, "state": a.state,
                "step": a.step, "loss": a.loss,
                "checkpoint_step": a.checkpoint.step if a.checkpoint else None,
                "checkpoint_age_s": now - a.checkpoint_time if a.checkpoint_time else None,
                "sync_steps": a.sync_steps, "sync_bytes_sent": a.sync_bytes_sent,
                "sync_bytes_received": a.sync_bytes_received, "drift": a.drift,
            })
    return rows


def fetch_main() -> None:
    run_command(fetch_command)


def status_main() -> None:
    run_command(status_command)
