"""swarm-status: which peers host which block, as a table or JSON."""

from __future__ import annotations

import json
import time

import click

from swarm.cli.console import run_command
from swarm.cli.options import member_options, swarm_client, swarm_options
from swarm.p2p.directory import Host


@click.command("swarm-status")
@swarm_options
@member_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True)
def status_command(as_json, model_timeout, **kwargs):
    """Show which peers host which block: state, step, recent loss, checkpoint age, replica drift, and
    how each is reached (direct, or relayed: behind NAT, through circuit relays)."""
    with swarm_client(kwargs) as client:
        config = client.directory.wait_for_model(model_timeout)
        rows = status_rows(client.directory.all_hosts(config.n_blocks))
    if as_json:
        click.echo(json.dumps({"swarm": client.swarm, "config_hash": config.hash(), "hosts": rows}, indent=2))
        return
    click.echo(f"swarm {client.swarm}: {config.n_blocks} blocks, config {config.hash()[:12]}")
    click.echo(f"{'block':>5}  {'peer':<14} {'name':<16} {'state':<9} {'step':>7} {'loss':>7} {'ckpt age':>9} {'drift':>8} "
               f"{'reached':<8}")
    for row in rows:
        age = f"{row['checkpoint_age_s']:.0f}s" if row["checkpoint_age_s"] is not None else "-"
        loss = f"{row['loss']:.3f}" if row["loss"] is not None else "-"
        drift = f"{row['drift']:.2e}" if row.get("drift") is not None else "-"
        click.echo(
            f"{row['block']:>5}  {row['peer_id'][-12:]:<14} {row['public_name'][:16]:<16} {row['state']:<9} "
            f"{row['step']:>7} {loss:>7} {age:>9} {drift:>8} {row['reached']:<8}"
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
                "sync_bytes_received": a.sync_bytes_received, "drift": a.drift, "reached": a.reached,
            })
    return rows


def main() -> None:
    run_command(status_command)
