"""Discovery: the time and DHT round trips a client needs to find every block's hosts, and how
soon a new announcement is seen, as the swarm grows from 8 to 64 DHT nodes.

The swarm grows in place (8, then 16, 32, 64 nodes by default). Every node is a real hivemind
DHT (`start_dht`: our validators, its own process and libp2p daemon) with its own RSA key,
hosting one block on paper and announcing it through `SwarmDirectory.announce` when it joins
and every announce period, as peers do; no model is trained. One Python process drives them
(`swarm.lab.discovery.AnnouncingSwarm`): 64 whole peers would not fit 2 cores, 64 DHT
processes with their daemons take about 6 GB. Where root allows (`netlab.available(delays=True)`),
the nodes live in the regions of benchmarks/regions.yaml, one network namespace per region
shared by that region's nodes, and the lab's router delays every packet between regions by
the configured one-way delay (between nodes of one region: no delay); elsewhere everything
runs on 127.0.0.1 and the JSON says so.

At each size, after the nodes have announced for `--settle` periods:
- fresh clients (`SwarmClient`, a client-mode DHT node as swarm-fetch starts; `--clients` per
  region) join and read every block's hosts `--rounds` times with `SwarmDirectory.hosts`, the
  library's own lookup (`get` with latest=True, over the nodes that hold the record's copies).
  Each lookup's find RPCs are recorded inside the client's DHT process: reported are its RPCs,
  its round trips (the calls it waited for one after the other; it sends up to 5 at a time,
  `network.RECORD_COPIES`), its round trips to the first node that holds the
  record (Kademlia's hops), its seconds, and the share of the block's hosts it found; and per
  client round, the seconds to find every block;
- visibility: a node in another region stores a new announcement (a new step), and the client
  reads that block every `--poll` seconds until it sees it; reported in seconds and in announce
  periods (the time the read that saw it returned, minus the time the store was sent).

    python benchmarks/discovery.py --sizes 8 16 32 64     # about 13 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from tqdm import tqdm

from swarm.cli.console import setup_logging
from swarm.errors import SwarmError
from swarm.files import write_atomic, write_picture
from swarm.lab import netlab
from swarm.lab.discovery import AnnouncingSwarm, last_lookup, spread
from swarm.p2p.client import SwarmClient
from swarm.p2p.records import block_key
from swarm.waiting import WaitTimeout, wait_for

logger = logging.getLogger("benchmarks.discovery")

SWARM = "discovery"
TARGETS = {"round_trips_median": 2, "round_trips_p95": 4, "visibility_periods": 2}


def stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": float(np.median(values)), "p95": float(np.percentile(values, 95)),
            "max": float(max(values))}  # fmt: skip


def read_every_block(client: SwarmClient, swarm: AnnouncingSwarm, region: str, round_: int) -> tuple[float, list[dict]]:
    """One pass over every block, as `SwarmDirectory.all_hosts` makes it: its seconds, and each lookup's trace."""
    expected = {b: {n.directory.owner_subkey for n in swarm.nodes if n.block == b} for b in range(swarm.n_blocks)}
    lookups, began = [], time.monotonic()
    for block in range(swarm.n_blocks):
        hosts = client.directory.hosts(block)
        trace = last_lookup(client.dht, block_key(SWARM, block))
        found = len(expected[block] & {h.owner for h in hosts}) / len(expected[block]) if expected[block] else None
        lookups.append({"client_region": region, "round": round_, "block": block, "rpcs": trace.rpcs,
                        "round_trips": trace.round_trips, "round_trips_to_value": trace.round_trips_to_value,
                        "seconds": trace.seconds, "hosts_found": found})  # fmt: skip
    return time.monotonic() - began, lookups


def visibility_trial(client: SwarmClient, swarm: AnnouncingSwarm, region: str, step: int, args,
                     rng: random.Random) -> dict:
    """A node (of another region, where there is one) stores a new announcement; seconds until `client` sees it."""
    writers = [n for n in swarm.nodes if n.region != region] or swarm.nodes
    writer = rng.choice(writers)

    def seen() -> bool:
        hosts = client.directory.hosts(writer.block)
        return any(h.owner == writer.directory.owner_subkey and h.announcement.step == step for h in hosts)

    sent = swarm.announce(writer, step=step)
    try:
        wait_for(seen, args.visibility_timeout * args.announce_period, "the new announcement", interval=args.poll)
        seconds = time.monotonic() - sent
    except WaitTimeout:
        seconds = None
    return {"reader_region": region, "writer_region": writer.region, "block": writer.block, "seconds": seconds,
            "periods": None if seconds is None else seconds / args.announce_period}  # fmt: skip


def measure(swarm: AnnouncingSwarm, regions: list[str], size: int, args, rng: random.Random) -> dict:
    """Grow the swarm to `size` nodes, let it announce, then read it from fresh clients."""
    new_nodes = spread(size, regions, args.blocks)[len(swarm.nodes) :]
    for region, block in tqdm(new_nodes, desc=f"nodes to {size}", unit="node"):
        swarm.add_node(region, block)
    swarm.start_announcing()
    time.sleep(args.settle * args.announce_period)  # every node announces in this time, as a running swarm does
    psutil.cpu_percent()
    joins, every_block, lookups, visibility = [], [], [], []
    readers = [r for r in regions for _ in range(args.clients)]
    for i, region in enumerate(tqdm(readers, desc=f"clients at {size}", unit="client")):
        began = time.monotonic()
        with swarm.client(region) as client:
            joins.append(time.monotonic() - began)
            for round_ in range(args.rounds):
                seconds, traced = read_every_block(client, swarm, region, round_)
                every_block.append(seconds)
                lookups += traced
            visibility.append(visibility_trial(client, swarm, region, 1000 * size + i, args, rng))
    return summarize(size, joins, every_block, lookups, visibility, psutil.cpu_percent())


def summarize(size: int, joins, every_block, lookups: list[dict], visibility: list[dict], cpu: float) -> dict:
    seen = [v["periods"] for v in visibility if v["periods"] is not None]
    return {
        "nodes": size,
        "lookup_round_trips": stats([x["round_trips"] for x in lookups]),
        "lookup_round_trips_to_value":
            stats([x["round_trips_to_value"] for x in lookups if x["round_trips_to_value"] is not None]),
        "lookup_rpcs": stats([x["rpcs"] for x in lookups]),
        "lookup_seconds": stats([x["seconds"] for x in lookups]),
        "hosts_found_min": min((x["hosts_found"] for x in lookups if x["hosts_found"] is not None), default=None),
        "every_block_seconds": stats(every_block),
        "client_join_seconds": stats(joins),
        "visibility_periods": stats(seen),
        "visibility_not_seen": len(visibility) - len(seen),
        "cpu_busy_percent": cpu,  # of the whole machine while clients read: a busy machine slows every RPC
        "lookups": lookups,
        "visibility": visibility,
    }


def check_targets(largest: dict) -> dict:
    """The issue's figures, at the largest size measured: round trips until the lookup returned
    (what a client waits for), and, beside them, the hops to the first node holding the record."""
    trips, hops = largest["lookup_round_trips"], largest["lookup_round_trips_to_value"]
    vis = largest["visibility_periods"]
    return {
        "nodes": largest["nodes"],
        "round_trips_median_le_2": trips["median"] <= TARGETS["round_trips_median"],
        "round_trips_p95_le_4": trips["p95"] <= TARGETS["round_trips_p95"],
        "visibility_le_2_periods": largest["visibility_not_seen"] == 0 and vis["max"] <= TARGETS["visibility_periods"],
        "round_trips_to_the_record_median_le_2": hops.get("median", float("inf")) <= TARGETS["round_trips_median"],
        "round_trips_to_the_record_p95_le_4": hops.get("p95", float("inf")) <= TARGETS["round_trips_p95"],
    }


def plot(sizes: list[dict], network: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [s["nodes"] for s in sizes]
    fig, (trips, secs, vis) = plt.subplots(1, 3, figsize=(16, 4.8))
    for key, label, color in (("lookup_rpcs", "find RPCs", "C2"), ("lookup_round_trips", "round trips", "C0"),
                              ("lookup_round_trips_to_value", "round trips to the record", "C1")):  # fmt: skip
        trips.plot(nodes, [s[key]["median"] for s in sizes], "o-", color=color, label=f"{label}, median")
        trips.plot(nodes, [s[key]["p95"] for s in sizes], "o--", color=color, alpha=0.5, label=f"{label}, p95")
    trips.axhline(TARGETS["round_trips_median"], color="g", ls=":", label="target: median round trips")
    trips.axhline(TARGETS["round_trips_p95"], color="r", ls=":", label="target: p95 round trips")
    trips.set(title="one block's lookup (SwarmDirectory.hosts)", ylabel="count")
    trips.set_ylim(0, 1.5 * max(s["lookup_rpcs"]["max"] for s in sizes))
    trips.legend(fontsize=7, ncol=2, loc="upper left")
    for key, label in (("lookup_seconds", "one block"), ("every_block_seconds", "every block")):
        medians = [s[key]["median"] for s in sizes]
        secs.errorbar(nodes, medians, yerr=[[0] * len(sizes), [s[key]["p95"] - m for s, m in zip(sizes, medians)]],
                      marker="o", capsize=3, label=f"{label} (median, bar to p95)")  # fmt: skip
    secs.set(title="time for a client to look up", ylabel="seconds")
    secs.legend(fontsize=8)
    for s in sizes:
        vis.scatter([s["nodes"]] * len(s["visibility"]), [v["periods"] or np.nan for v in s["visibility"]],
                    alpha=0.5, color="C0")
    vis.plot(nodes, [s["visibility_periods"].get("median", np.nan) for s in sizes], "C0-",
             label="median (dots: each trial)")
    vis.axhline(TARGETS["visibility_periods"], color="r", ls=":", label="target")
    vis.set(title="a new announcement is seen after", ylabel="announce periods")
    vis.legend(fontsize=8)
    for ax in (trips, secs, vis):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="DHT nodes", xticks=nodes, xticklabels=[str(n) for n in nodes])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.suptitle(f"discovery, {network['placement']}", fontsize=10)
    fig.tight_layout()
    write_picture(path, fig, dpi=110)


def run(args, regions: list[str], lab: netlab.NetLab | None) -> list[dict]:
    rng = random.Random(args.seed)
    results = []
    with AnnouncingSwarm(SWARM, args.blocks, args.announce_period, lab=lab) as swarm:
        for size in sorted(args.sizes):
            results.append(measure(swarm, regions, size, args, rng))
            logger.info("%d nodes: round trips %s, visibility %s periods", size,
                        results[-1]["lookup_round_trips"], results[-1]["visibility_periods"])  # fmt: skip
    return results


def run_placed(args) -> tuple[dict, list[dict]]:
    """The runs, in emulated regions where this machine can make them, else on 127.0.0.1; and where they ran."""
    if reason := netlab.available(delays=True):
        return {"placement": "127.0.0.1", "why_not_regions": reason}, run(args, ["local"], None)
    spec, one_way_s = netlab.load_regions(Path(args.regions))
    regions = list(spec)
    with netlab.NetLab("bswdisc") as lab:
        for region in regions:
            lab.add_node(region, region)
        lab.start_delays(one_way_s)
        round_trips = {f"{a}-{b}": 2000 * one_way_s(a, b) for i, a in enumerate(regions) for b in regions[i + 1 :]}
        network = {"placement": "emulated regions", "regions": regions, "round_trip_ms": round_trips,
                   "within_a_region": "one shared namespace: no delay, no router"}  # fmt: skip
        return network, run(args, regions, lab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64],
                        help="DHT nodes, the swarm grows through them")
    parser.add_argument("--blocks", type=int, default=8, help="blocks the nodes host (node i hosts block i mod B)")
    parser.add_argument("--announce-period", type=float, default=10.0, help="seconds; swarm-peer's default")
    parser.add_argument("--settle", type=float, default=1.0, help="announce periods to wait after each growth")
    parser.add_argument("--clients", type=int, default=2, help="fresh clients per region at each size")
    parser.add_argument("--rounds", type=int, default=3, help="passes over every block by each client")
    parser.add_argument("--poll", type=float, default=0.2,
                        help="seconds between a reader's lookups for a new announcement")
    parser.add_argument("--visibility-timeout", type=float, default=6.0, help="announce periods to wait for it")
    parser.add_argument("--regions", default=str(Path(__file__).with_name("regions.yaml")))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/discovery")
    parser.add_argument("--from-json", default=None, help="only plot and print an earlier discovery.json")
    args = parser.parse_args()
    if args.from_json:
        earlier = json.loads(Path(args.from_json).read_text())
        finish(earlier, Path(args.out))
        return
    if min(args.sizes) < 2 or args.blocks < 1 or args.announce_period <= 0 or args.clients < 1 or args.rounds < 1:
        parser.error("--sizes must be at least 2, and --blocks, --announce-period, --clients, --rounds positive")
    setup_logging()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every DHT, remove the lab
    began = time.monotonic()
    try:
        network, sizes = run_placed(args)
    except SwarmError as error:
        print(f"discovery.py: error: {error}", file=sys.stderr)
        sys.exit(1)
    # settings, never this machine's paths: the regions file relative to the repository root
    config = {**vars(args), "regions": os.path.relpath(args.regions, Path(__file__).resolve().parent.parent)}
    result = {"config": config, "network": network, "targets": check_targets(sizes[-1]),
              "wall_seconds": time.monotonic() - began, "sizes": sizes}  # fmt: skip
    finish(result, Path(args.out))


def finish(result: dict, out: Path) -> None:
    """discovery.json with every lookup and trial, the PNG, and the figures without them on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "discovery.json", json.dumps(result, indent=2).encode())
    plot(result["sizes"], result["network"], out / "discovery.png")
    brief = [{k: v for k, v in s.items() if k not in ("lookups", "visibility")} for s in result["sizes"]]
    print(json.dumps({**result, "sizes": brief}, indent=2))


if __name__ == "__main__":
    main()
