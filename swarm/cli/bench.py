"""swarm-bench latency: where the time goes between this machine and a live swarm.

Joins the swarm as a client and measures, for every peer it finds: the round trip of a P2P
ping (several samples: median, min, max), the time of a DHT lookup of every block, the
download rate of each host's block checkpoint, the replica-sync round each peer last took
(from its record), and the latency of single-pass generation, split by block (and, where
the peers serve autoregressive stages, of the autoregressive baseline). Prints a table,
writes JSON and a PNG (ping times, download rates, where a generation's time goes).

The single pass takes generation's default steps per block unless told (`--steps-per-block`):
each block's request carries all its steps, so the count changes what a request computes, not
how many requests a span takes, and the ratio to the autoregressive baseline is the one a user
of `swarm-generate` gets. The JSON records the count beside the single pass's time.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from types import ModuleType

import click

from swarm.checkpoints.download import download
from swarm.checkpoints.transfer import TransferError
from swarm.cli.console import Group, run_command
from swarm.cli.options import member_options, steps_per_block_option, swarm_client, swarm_options
from swarm.errors import SwarmError
from swarm.files import write_atomic, write_picture
from swarm.model.generate import continue_text
from swarm.p2p.client import SwarmClient
from swarm.p2p.directory import Host
from swarm.p2p.reachability import ensure_direct, route
from swarm.serving.ar_pipeline import generate_autoregressive
from swarm.serving.remote import RemoteBlocks

logger = logging.getLogger(__name__)

PROMPT = b"The history of the city begins with"
REQUEST_TIMEOUT_S = 60.0


def measure_latency(
    client: SwarmClient, samples: int, gen_bytes: int, steps_per_block: int, autoregressive: bool, downloads: bool
) -> dict:
    config = client.wait_for_model(30)
    lookups, hosts = {}, []
    for block in range(config.n_blocks):
        started = time.perf_counter()
        found = client.directory.hosts(block)
        lookups[block] = time.perf_counter() - started
        hosts += found
    runner = RemoteBlocks(client.directory, client.p2p, client.loop, config, request_timeout=REQUEST_TIMEOUT_S)
    peers = {}
    for host in hosts:
        a = host.announcement
        if host.peer_id not in peers:
            peers[host.peer_id] = {"name": a.public_name, "blocks": [], "reached": a.reached,
                                   **_round_trips(client, runner, host.peer_id, samples),
                                   "sync_round_s": a.sync_round_s, "state": a.state, "step": a.step}  # fmt: skip
        peers[host.peer_id]["blocks"].append(host.block)
        if downloads and a.checkpoint is not None:
            peers[host.peer_id]["download"] = _download_rate(client, host)
    result = {"n_blocks": config.n_blocks, "dht_lookup_s": lookups, "peers": peers}
    result["single_pass"] = _single_pass(runner, config, gen_bytes, steps_per_block)
    if autoregressive:
        stage_peers = [runner.choose(block).peer_id for block in range(config.n_blocks)]
        started = time.perf_counter()
        _, hops = generate_autoregressive(
            client.loop, client.p2p, stage_peers, config, PROMPT, gen_bytes, REQUEST_TIMEOUT_S
        )
        result["autoregressive"] = {"seconds": time.perf_counter() - started, "hops": hops, "bytes": gen_bytes}
        result["latency_ratio_autoregressive_over_single_pass"] = (
            result["autoregressive"]["seconds"] / result["single_pass"]["seconds"]
        )
    return result


def _round_trips(client: SwarmClient, runner: RemoteBlocks, peer_id: str, samples: int) -> dict:
    """Ping round trips over the route requests take (`rtt_ms`) and that route. A peer behind NAT
    is first reached through a relay: those round trips are `relayed_rtt_ms`, and then it is
    asked to dial back, as downloads and requests do."""
    pings = [runner.ping(peer_id) for _ in range(samples)]
    result = {"route": client.run(route(client.p2p, peer_id), REQUEST_TIMEOUT_S)}
    if result["route"] == "relayed":
        result["relayed_rtt_ms"] = _spread([1000 * r for r in pings])
        result["route"] = client.run(ensure_direct(client.p2p, peer_id), REQUEST_TIMEOUT_S)
        pings = [runner.ping(peer_id) for _ in range(samples)]
    return {**result, "rtt_ms": _spread([1000 * r for r in pings])}


def _spread(values: list[float]) -> dict:
    finite = [v for v in values if v != float("inf")]
    if not finite:
        return {"median": None, "min": None, "max": None, "lost": len(values)}
    return {
        "median": statistics.median(finite),
        "min": min(finite),
        "max": max(finite),
        "lost": len(values) - len(finite),
    }


def _download_rate(client: SwarmClient, host: Host) -> dict:
    """The rate of the whole download from this one host (owner check, chunk list and stream set-up
    included), and of the transfer alone (from the first stream's header to the last byte)."""
    started, timings = time.perf_counter(), {}
    try:
        data = client.run(download(client.p2p, [host], show_progress=False, timings=timings), 600).data
    except (TransferError, TimeoutError) as error:
        return {"error": str(error)}
    ended = time.perf_counter()
    return {"bytes": len(data), "seconds": ended - started, "mbit_per_s": 8 * len(data) / (ended - started) / 1e6,
            "transfer_mbit_per_s": 8 * len(data) / (ended - timings["header"]) / 1e6}  # fmt: skip


def _single_pass(runner: RemoteBlocks, config, gen_bytes: int, steps_per_block: int) -> dict:
    for block in range(config.n_blocks):  # a checkpoint with one key is measured first, once: not a pass's time
        runner.choose(block)
    runner.hop_seconds.clear()
    started = time.perf_counter()
    text = b"".join(continue_text(runner, config, PROMPT, gen_bytes, steps_per_block=steps_per_block))
    seconds = time.perf_counter() - started
    per_block = {b: sum(times) for b, times in sorted(runner.hop_seconds.items())}
    return {"seconds": seconds, "bytes": len(text), "steps_per_block": steps_per_block,
            "hops": sum(len(t) for t in runner.hop_seconds.values()),
            "seconds_per_block": per_block, "seconds_outside_requests": seconds - sum(per_block.values())}  # fmt: skip


def print_table(result: dict) -> None:
    click.echo(f"{'peer':<14} {'name':<12} {'blocks':<8} {'rtt ms (min-max)':<22} {'download':>14} {'sync round':>11}")
    for peer_id, p in result["peers"].items():
        rtt = p["rtt_ms"]
        rtt_text = (
            f"{rtt['median']:.1f} ({rtt['min']:.1f}-{rtt['max']:.1f})" if rtt["median"] is not None else "no answer"
        )
        rate = p.get("download", {})
        rate_text = f"{rate['mbit_per_s']:.1f} Mbit/s" if "mbit_per_s" in rate else rate.get("error", "-")[:14]
        sync = f"{p['sync_round_s']:.3f} s" if p["sync_round_s"] is not None else "-"
        blocks = ",".join(map(str, p["blocks"]))
        click.echo(f"{peer_id[-12:]:<14} {p['name'][:12]:<12} {blocks:<8} {rtt_text:<22} {rate_text:>14} {sync:>11}")
    lookups = ", ".join(f"{b}: {1000 * s:.0f} ms" for b, s in result["dht_lookup_s"].items())
    click.echo(f"DHT lookups: {lookups}")
    sp = result["single_pass"]
    click.echo(
        f"single pass: {sp['bytes']} bytes in {sp['seconds']:.2f} s ({sp['hops']} requests, "
        f"{sp['steps_per_block']} steps per block)"
    )
    if "autoregressive" in result:
        ar = result["autoregressive"]
        click.echo(
            f"autoregressive: {ar['bytes']} bytes in {ar['seconds']:.2f} s ({ar['hops']} requests); "
            f"ratio {result['latency_ratio_autoregressive_over_single_pass']:.1f}"
        )


def pyplot() -> ModuleType:
    """matplotlib's pyplot, drawing to files. matplotlib comes with the `bench` extra, not the core
    (only this command draws): without it, one line that says how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise SwarmError("swarm-bench draws its plots with matplotlib, which is not installed: "
                         "pip install 'blockswarm[bench]'") from None  # fmt: skip
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    names = [p["name"] or peer[-6:] for peer, p in result["peers"].items()]
    fig, (rtt, rate, gen) = plt.subplots(1, 3, figsize=(15, 4))
    medians = [p["rtt_ms"]["median"] or 0 for p in result["peers"].values()]
    rtt.imshow([medians], aspect="auto", cmap="viridis")
    rtt.set(title="ping round trip from here (ms)", xticks=range(len(names)), xticklabels=names, yticks=[])
    for i, value in enumerate(medians):
        rtt.text(i, 0, f"{value:.0f}", ha="center", va="center", color="w")
    rates = [p.get("download", {}).get("mbit_per_s", 0) for p in result["peers"].values()]
    rate.bar(names, rates)
    rate.set(title="checkpoint download rate", ylabel="Mbit/s")
    sp = result["single_pass"]
    parts = {f"block {b}": s for b, s in sp["seconds_per_block"].items()}
    parts["client"] = max(0.0, sp["seconds_outside_requests"])
    gen.bar(list(parts), list(parts.values()))
    gen.set(title=f"single pass, {sp['bytes']} bytes: {sp['seconds']:.2f} s", ylabel="seconds")
    for axis in (rate, gen):
        axis.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    write_picture(path, fig, dpi=110)


@click.group("swarm-bench", cls=Group)
def bench_group() -> None:
    """Measurements against a live swarm."""


@bench_group.command("latency")
@swarm_options
@member_options
@click.option("--samples", type=click.IntRange(min=1), default=5, show_default=True, help="Pings per peer.")
@click.option("--gen-bytes", type=click.IntRange(min=1), default=64, show_default=True,
              help="Bytes the timed generation writes.")
@steps_per_block_option
@click.option(
    "--autoregressive/--no-autoregressive",
    default=False,
    show_default=True,
    help="Also time the autoregressive baseline (peers must run --serve-ar-stage).",
)
@click.option(
    "--downloads/--no-downloads", default=True, show_default=True, help="Time a checkpoint download from each host."
)
@click.option("--out", default="latency", show_default=True, help="Folder for latency.json and latency.png.")
def latency_command(samples, gen_bytes, steps_per_block, autoregressive, downloads, out, **kwargs):
    """Ping, DHT lookup, checkpoint download, sync round and generation latency of every peer."""
    pyplot()  # before minutes of measuring: without matplotlib, nothing could be drawn at the end
    with swarm_client(kwargs) as client:
        result = measure_latency(client, samples, gen_bytes, steps_per_block, autoregressive, downloads)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "latency.json", json.dumps(result, indent=2).encode())
    plot(result, folder / "latency.png")
    print_table(result)


def main() -> None:
    run_command(bench_group)


if __name__ == "__main__":
    main()
