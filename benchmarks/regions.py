"""Emulated regions: a swarm spread over network namespaces with real delays and link caps.

Reads a YAML file of regions (link caps per host) and one-way delays between them (default:
benchmarks/regions.yaml), builds a NetLab (a namespace per process, one router that delays
every packet by its regions' one-way delay and caps each host's links), starts a bootstrap
node and peers there (one per block in the first region, plus replicas of block 0 and 1
elsewhere, so that replica sync crosses regions), and runs `swarm-bench latency` from a
client in every region. Checks the measured round trips against the configured ones and
reports, per client region, checkpoint download rates, sync rounds, single-pass generation
latency, and (from --ar-region) the autoregressive baseline for --gen-bytes.

Needs root, iptables and the NetfilterQueue package; says so in one line otherwise.
Teardown removes every namespace, rule and process it made, also after an error or Ctrl-C.

    python benchmarks/regions.py --gen-bytes 256 --ar-region home
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
from pathlib import Path

from swarm.cli.console import setup_logging
from swarm.lab import netlab
from swarm.lab.launch import LocalSwarm
from swarm.waiting import wait_for

logger = logging.getLogger("benchmarks.regions")


def run(args, regions: dict, one_way_s, workdir: Path) -> dict:
    names = list(regions)
    home = args.peer_region
    others = [r for r in names if r != home]
    peers = {f"p{b}-{home}": (b, home) for b in range(4)}  # the default model has 4 blocks
    for block, region in zip((0, 1), others):
        peers[f"p{block}-{region}"] = (block, region)
    with netlab.NetLab("bswregions") as lab:
        lab.add_node("bootstrap", home)
        for name, (_, region) in peers.items():
            lab.add_node(name, region)
        for region in names:
            lab.add_node(f"client-{region}", region)
        for node in lab.nodes.values():
            caps = regions[node.region]
            lab.cap(node, caps.get("up_mbit"), caps.get("down_mbit"))
        lab.start_delays(one_way_s)
        with LocalSwarm(workdir, swarm="regions", lab=lab) as local:
            local.start_bootstrap(refresh_period=5)
            extra = ["--max-steps", str(args.peer_steps), "--save-every", str(args.peer_steps), "--announce-period", "3",
                     "--serve-ar-stage", "--sync", "demo", "--sync-deadline", "5", "--batch-size", "8"]  # fmt: skip
            for name, (block, _) in peers.items():
                local.start_peer(name, str(block), extra)
            client = f"client-{names[0]}"
            wait_for(lambda: local.serving(list(peers), host=client), args.timeout, "every peer serving", interval=3)
            results = {}
            for region in names:
                out = workdir / f"latency-{region}"
                bench = ["--samples", str(args.samples), "--gen-bytes", str(args.gen_bytes), "--out", str(out)]
                if region == args.ar_region:
                    bench.append("--autoregressive")
                done = local.run("swarm-bench", *bench, subcommand="latency", host=f"client-{region}", timeout=args.timeout)
                if done.returncode != 0:
                    raise RuntimeError(f"swarm-bench from {region} failed: {done.stderr[-2000:]}")
                results[region] = json.loads((out / "latency.json").read_text())
                logger.info("from %s:\n%s", region, done.stdout)
    return {"peers": {n: {"block": b, "region": r} for n, (b, r) in peers.items()}, "from": results}


def summarize(runs: dict, regions: dict, one_way_s) -> dict:
    """Measured against configured round trips, and the figures per client region."""
    region_of = {name: p["region"] for name, p in runs["peers"].items()}
    rtt_checks, per_client = [], {}
    for client, result in runs["from"].items():
        rates, transfer_rates, syncs = [], [], {}
        for p in result["peers"].values():
            configured = 2000 * one_way_s(client, region_of[p["name"]])
            measured = p["rtt_ms"]["median"]
            check = {"from": client, "to": p["name"], "configured_ms": configured, "measured_ms": measured}
            if client != region_of[p["name"]]:  # within a region the ping's own processing (ms) dominates
                check["within_10_percent"] = measured is not None and abs(measured - configured) <= 0.1 * configured
            rtt_checks.append(check)
            if "mbit_per_s" in p.get("download", {}):
                rates.append(p["download"]["mbit_per_s"])
                transfer_rates.append(p["download"]["transfer_mbit_per_s"])
            syncs[p["name"]] = p["sync_round_s"]
        cap = regions[client].get("down_mbit")
        per_client[client] = {
            "download_mbit_per_s": rates,
            "transfer_mbit_per_s": transfer_rates,  # from the stream's header to its last byte
            "download_cap_mbit": cap,
            "slowest_download_over_cap": (min(rates) / cap) if rates and cap else None,
            "slowest_transfer_over_cap": (min(transfer_rates) / cap) if transfer_rates and cap else None,
            "single_pass_seconds": result["single_pass"]["seconds"],
            "single_pass_bytes": result["single_pass"]["bytes"],
            "autoregressive_seconds": result.get("autoregressive", {}).get("seconds"),
            "latency_ratio_autoregressive_over_single_pass": result.get("latency_ratio_autoregressive_over_single_pass"),
            "sync_round_s_by_peer": syncs,
        }
    between = [c for c in rtt_checks if "within_10_percent" in c]
    return {"rtt": rtt_checks, "inter_region_rtts_within_10_percent": f"{sum(c['within_10_percent'] for c in between)} of {len(between)}",
            "per_client_region": per_client}  # fmt: skip


def plot(runs: dict, summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients, peers = list(runs["from"]), list(runs["peers"])
    measured = {(c["from"], c["to"]): c["measured_ms"] or 0 for c in summary["rtt"]}
    grid = [[measured.get((c, p), 0) for p in peers] for c in clients]
    fig, (heat, rate, gen) = plt.subplots(1, 3, figsize=(17, 5))
    heat.imshow(grid, cmap="viridis", aspect="auto")
    heat.set(title="measured ping round trip (ms)", xticks=range(len(peers)), xticklabels=peers,
             yticks=range(len(clients)), yticklabels=[f"client {c}" for c in clients])  # fmt: skip
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            heat.text(j, i, f"{value:.0f}", ha="center", va="center", color="w", fontsize=8)
    heat.tick_params(axis="x", rotation=45)
    per_client = summary["per_client_region"]
    for client, figures in per_client.items():
        rate.scatter([client] * len(figures["download_mbit_per_s"]), figures["download_mbit_per_s"])
        if figures["download_cap_mbit"]:
            rate.hlines(figures["download_cap_mbit"], clients.index(client) - 0.3, clients.index(client) + 0.3, colors="r")
    rate.set(title="checkpoint download rate per host (red: cap)", ylabel="Mbit/s")
    gen.bar(clients, [per_client[c]["single_pass_seconds"] for c in clients], label="single pass")
    ar = [per_client[c]["autoregressive_seconds"] or 0 for c in clients]
    if any(ar):
        gen.bar(clients, ar, alpha=0.4, label="autoregressive")
        gen.set_yscale("log")
    gen.set(title="generation latency from each region", ylabel="seconds")
    gen.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", default=str(Path(__file__).with_name("regions.yaml")))
    parser.add_argument("--peer-region", default="eu-west", help="region of the peers that host every block")
    parser.add_argument("--ar-region", default="home", help="client region that also times the autoregressive baseline")
    parser.add_argument("--gen-bytes", type=int, default=256)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--peer-steps", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", default="benchmarks/results/regions")
    parser.add_argument("--from-json", default=None, help="summarize and plot the runs of an earlier regions.json")
    args = parser.parse_args()
    setup_logging()
    if args.from_json:
        earlier = json.loads(Path(args.from_json).read_text())
        regions, one_way_s = netlab.load_regions(Path(earlier["config"]["regions"]))
        finish(earlier["config"], regions, one_way_s, earlier["runs"], Path(args.out))
        return
    if reason := netlab.available(delays=True):
        print(f"regions.py: error: {reason}", file=sys.stderr)
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the teardown on SIGTERM too
    regions, one_way_s = netlab.load_regions(Path(args.regions))
    with tempfile.TemporaryDirectory() as tmp:
        runs = run(args, regions, one_way_s, Path(tmp))
    finish(vars(args), regions, one_way_s, runs, Path(args.out))


def finish(config: dict, regions: dict, one_way_s, runs: dict, out: Path) -> None:
    """Summary, PNG and JSON of a run."""
    summary = summarize(runs, regions, one_way_s)
    out.mkdir(parents=True, exist_ok=True)
    plot(runs, summary, out / "regions.png")
    result = {"config": config, "regions": regions, "summary": summary, "runs": runs}
    (out / "regions.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
