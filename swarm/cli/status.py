"""swarm-status: which peers host which block, or each key's verified contributions, as a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import click

from swarm.cli.console import Command, run_command
from swarm.cli.options import member_options, swarm_client, swarm_options
from swarm.errors import SwarmError
from swarm.files import write_atomic
from swarm.p2p.directory import Host
from swarm.p2p.ledger import Ledger

CSV_COLUMNS = ("key", "name", "verified_steps", "accepted_payloads", "agreed_answers", "uptime_s", "attesters")


@click.command("swarm-status", cls=Command)
@swarm_options
@member_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--contributions", is_flag=True,
              help="Show each key's contributions that two other keys attest (the ledger), not the hosts.")  # fmt: skip
@click.option("--csv", "csv_path", default=None,
              help="Also write the contributions to this CSV file (implies --contributions).")  # fmt: skip
@click.option("--model-timeout", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="Seconds to wait for the swarm's model record (its creator's) before giving up.")
def status_command(as_json, contributions, csv_path, model_timeout, **kwargs):
    """Show which peers host which block: state, step, recent loss, checkpoint age, replica drift, and
    how each is reached (direct, or relayed: behind NAT, through circuit relays). With --contributions,
    each key's verified contributions instead (docs/contributions.md)."""
    with swarm_client(kwargs) as client:
        config = client.directory.wait_for_model(model_timeout)
        hosts = client.directory.all_hosts(config.n_blocks)
        if contributions or csv_path:
            ledger = Ledger(client.swarm, client.directory.membership)
            ledger.take(client.directory.attestations())
            credits = ledger.rows(h for found in hosts.values() for h in found)
    if contributions or csv_path:
        show_contributions(credits, as_json, csv_path)
        return
    rows = status_rows(hosts)
    if as_json:
        click.echo(json.dumps({"swarm": client.swarm, "config_hash": config.hash(), "hosts": rows}, indent=2))
        return
    click.echo(f"swarm {client.swarm}: {config.n_blocks} blocks, config {config.hash()[:12]}")
    click.echo(f"{'block':>5}  {'peer':<14} {'name':<16} {'state':<9} {'step':>7} {'loss':>7} {'ckpt age':>9} "
               f"{'drift':>8} {'reached':<8}")
    for row in rows:
        age = f"{row['checkpoint_age_s']:.0f}s" if row["checkpoint_age_s"] is not None else "-"
        loss = f"{row['loss']:.3f}" if row["loss"] is not None else "-"
        drift = f"{row['drift']:.2e}" if row.get("drift") is not None else "-"
        click.echo(
            f"{row['block']:>5}  {row['peer_id'][-12:]:<14} {row['public_name'][:16]:<16} {row['state']:<9} "
            f"{row['step']:>7} {loss:>7} {age:>9} {drift:>8} {row['reached']:<8}"
        )


def show_contributions(rows: list[dict], as_json: bool, csv_path: str | None) -> None:
    """Print the ledger's rows (and write them to `csv_path`, if given)."""
    if csv_path:
        write_csv(Path(csv_path), rows)
    if as_json:
        click.echo(json.dumps({"contributions": rows}, indent=2))
        return
    header = f"{'key':<12}  {'name':<16} {'verified steps':>14} {'payloads':>9} {'answers':>8} {'uptime':>8}"
    click.echo(f"{header}  attested by")
    for row in rows:
        click.echo(f"{row['key'][:12]:<12}  {row['name'][:16] or '-':<16} {row['verified_steps']:>14} "
                   f"{row['accepted_payloads']:>9} {row['agreed_answers']:>8} {row['uptime_s']:>7}s  "
                   f"{' '.join(row['attesters'])}")  # fmt: skip


def write_csv(path: Path, rows: list[dict]) -> None:
    """The ledger's rows as CSV, written atomically; SwarmError if the file cannot be written. A name
    that a spreadsheet would take for a formula is written with a quote in front."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        name = "'" + row["name"] if row["name"][:1] in ("=", "+", "-", "@") else row["name"]
        writer.writerow([row["key"], name, *(row[c] for c in CSV_COLUMNS[2:6]), " ".join(row["attesters"])])
    try:
        write_atomic(path, text.getvalue().encode())
    except OSError as error:
        raise SwarmError(f"cannot write the CSV file {path}: {error.strerror or error}") from None


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


if __name__ == "__main__":
    main()
