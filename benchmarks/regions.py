"""Emulated regions: a swarm spread over network namespaces with real delays and link caps.

Reads a YAML file of regions (link caps per host) and one-way delays between them (default:
benchmarks/regions.yaml), builds a NetLab (a namespace per process, one router that delays
every packet by its regions' one-way delay and caps each host's links), starts a bootstrap
node and peers there (one per block in the first region, plus replicas of block 0 and 1
elsewhere, so that replica sync crosses regions), and runs `swarm-bench latency` from a
client in every region. Checks the measured round trips against the configured ones and
reports, per client region, checkpoint download rates, sync rounds, single-pass generation
latency, and (from --ar-region) the autoregressive baseline for --gen-bytes.

Behind NAT: a `behind_nat` region (--nat-region, default home-nat) puts its hosts behind a
home router. Once the swarm is trained, two more hosts of block 0 join: one there and its
twin at the same place without NAT (--twin-region). Reported: the seconds until a client
elsewhere reaches each, and, from --nat-client, with every other host of block 0 stopped,
the round trip (through the relay, and once the NATed host dialed the client back),
checkpoint download rate and single-pass latency via the NATed host over via its twin, and
the bytes the bootstrap (the only relay) sent and received while each served block 0.

Needs root, iptables and the NetfilterQueue package; says so in one line otherwise.
Teardown removes every namespace, rule and process it made, also after an error or Ctrl-C.

    python benchmarks/regions.py --gen-bytes 256 --ar-region home
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from swarm.cli.console import setup_logging
from swarm.files import write_atomic, write_picture
from swarm.lab import netlab
from swarm.lab.launch import LocalSwarm
from swarm.model.generate import STEPS_PER_BLOCK
from swarm.p2p.pings import timed_info
from swarm.waiting import wait_for


def run(args, regions: dict, one_way_s, workdir: Path) -> dict:
    names = [r for r in regions if not regions[r].get("behind_nat")]
    home = args.peer_region
    others = [r for r in names if r != home]
    peers = {f"p{b}-{home}": (b, home) for b in range(4)}  # the default model has 4 blocks
    for block, region in zip((0, 1), others):
        peers[f"p{block}-{region}"] = (block, region)
    twins = nat_twins(args, regions)  # block 0 behind NAT and, beside it, without
    with netlab.NetLab("bswregions", subnet=netlab.PUBLIC_SUBNET if twins else netlab.SUBNET) as lab:
        routers = {r: lab.add_nat(r) for r in regions if regions[r].get("behind_nat")}
        lab.add_node("bootstrap", home)
        for name, (_, region) in {**peers, **twins}.items():
            lab.add_node(name, region, behind=routers.get(region))
        for region in regions:
            lab.add_node(f"client-{region}", region, behind=routers.get(region))
        lab.cap_by_region(regions, skip=list(routers.values()))
        lab.start_delays(one_way_s)
        with LocalSwarm(workdir, swarm="regions", lab=lab) as local:
            local.start_bootstrap(refresh_period=5)
            extra = ["--max-steps", str(args.peer_steps), "--save-every", str(args.peer_steps),
                     "--announce-period", "3", "--serve-ar-stage", "--sync", "demo", "--sync-deadline", "5",
                     "--batch-size", "8"]  # fmt: skip
            started = {name: local.start_peer(name, str(block), extra) for name, (block, _) in peers.items()}
            client = f"client-{names[0]}"
            wait_for(lambda: local.serving(list(peers), host=client), args.timeout, "every peer serving", interval=3)
            reachable = {}
            if twins:  # they join a trained swarm: the time each takes until a client elsewhere reaches it
                for name, (block, _) in twins.items():
                    started[name] = local.start_peer(name, str(block), extra)
                reachable = time_to_reachable(local, f"client-{args.nat_client}", twins, args.timeout)
                wait_for(
                    lambda: local.serving(list(twins), host=client), args.timeout, "the NAT twins serving", interval=3
                )
            results = {}
            for region in regions:
                bench = ["--autoregressive"] if region == args.ar_region else []
                results[region] = latency(local, args, f"client-{region}", workdir / f"latency-{region}", bench)
            nat = compare_nat(local, args, lab, twins, peers, started, workdir) if twins else None
    runs = {"peers": {n: {"block": b, "region": r} for n, (b, r) in {**peers, **twins}.items()}, "from": results}
    return {**runs, "nat": {"reachable_s": reachable, **nat}} if twins else runs


def nat_twins(args, regions: dict) -> dict[str, tuple[int, str]]:
    """Two hosts of block 0 at the same place, one behind the NAT region's router and one not."""
    if args.nat_region not in regions:
        return {}
    if (
        not regions[args.nat_region].get("behind_nat")
        or args.twin_region not in regions
        or regions[args.twin_region].get("behind_nat")
    ):
        raise SystemExit(f"regions.py: error: --nat-region {args.nat_region} must be behind_nat, --twin-region "
                         f"{args.twin_region} a region that is not")  # fmt: skip
    return {f"p0-{args.twin_region}": (0, args.twin_region), f"p0-{args.nat_region}": (0, args.nat_region)}


def latency(local: LocalSwarm, args, host: str, out: Path, extra: list[str] = ()) -> dict:
    options = ["--samples", str(args.samples), "--gen-bytes", str(args.gen_bytes),
               "--steps-per-block", str(args.steps_per_block), *extra]  # fmt: skip
    return local.latency(host, out, options, args.timeout)


def time_to_reachable(local: LocalSwarm, host: str, twins: dict, timeout: float) -> dict:
    """Seconds from each twin's start until a client on `host` finds its record and gets an
    answer from it (through a relay, for the one behind NAT), and how it says it is reached."""
    started, found = time.monotonic(), {}
    with local.client(host) as client:
        while len(found) < len(twins) and time.monotonic() - started < timeout:
            for h in client.directory.hosts(0):
                name = h.announcement.public_name
                if name in twins and name not in found and client.run(timed_info(client.p2p, h.peer_id, 5), 6)[1]:
                    found[name] = {"seconds": time.monotonic() - started, "reached": h.announcement.reached}
            time.sleep(0.5)
    if len(found) < len(twins):
        raise RuntimeError(f"not reachable within {timeout:.0f}s: {sorted(set(twins) - set(found))}")
    return found


def compare_nat(
    local: LocalSwarm, args, lab: netlab.NetLab, twins: dict, peers: dict, started: dict, workdir: Path
) -> dict:
    """From one client: block 0 served by the direct twin (every other host of block 0 gone),
    then by the NATed twin alone; the bootstrap (the only relay) counts its bytes meanwhile."""
    direct_twin, nat_twin = twins
    host = f"client-{args.nat_client}"

    def only(names: set[str]) -> bool:
        rows = local.status_rows(host)
        return {r["public_name"] for r in rows if r["block"] == 0 and r["state"] == "serving"} == names

    for name in [n for n, (block, _) in peers.items() if block == 0]:
        local.stop(started[name])
    wait_for(lambda: only(set(twins)), args.timeout, "block 0 on the twins alone", interval=3)
    via_direct = counted(lab.nodes["bootstrap"], lambda: latency(local, args, host, workdir / "nat-direct"))
    local.stop(started[direct_twin])
    wait_for(lambda: only({nat_twin}), args.timeout, "block 0 on the NATed twin alone", interval=3)
    via_nat, relay_bytes = counted(lab.nodes["bootstrap"], lambda: latency(local, args, host, workdir / "nat-relayed"))
    return {"from": args.nat_client, "direct_twin": direct_twin, "nat_twin": nat_twin, "via_direct": via_direct[0],
            "via_nat": via_nat, "bootstrap_bytes_via_direct": via_direct[1],
            "bootstrap_bytes_via_nat": relay_bytes}  # fmt: skip


def counted(node: netlab.Node, measure: Callable[[], dict]) -> tuple[dict, int]:
    """`measure()` and the bytes `node` sent and received meanwhile."""
    before = node.counter("rx_bytes") + node.counter("tx_bytes")
    result = measure()
    return result, node.counter("rx_bytes") + node.counter("tx_bytes") - before


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
            "latency_ratio_autoregressive_over_single_pass": result.get(
                "latency_ratio_autoregressive_over_single_pass"
            ),
            "sync_round_s_by_peer": syncs,
        }
    between = [c for c in rtt_checks if "within_10_percent" in c]
    within = f"{sum(c['within_10_percent'] for c in between)} of {len(between)}"
    summary = {"rtt": rtt_checks, "inter_region_rtts_within_10_percent": within, "per_client_region": per_client}
    if "nat" not in runs:
        return summary
    behind_nat = [c for c in runs["from"] if regions[c].get("behind_nat")]
    return {**summary, "nat": summarize_nat(runs["nat"], runs["from"][behind_nat[0]] if behind_nat else None)}


def summarize_nat(nat: dict, from_behind_nat: dict | None) -> dict:
    """Relayed (behind NAT) over direct, from the same client to twins at the same place; and
    what a client behind the same router got from the NATed twin (`from_behind_nat`)."""
    direct, behind = nat["direct_twin"], nat["nat_twin"]
    both = {p["name"]: p for p in nat["via_direct"]["peers"].values()}  # one run: both twins measured alike
    rtt = {name: both[name]["rtt_ms"]["median"] for name in (direct, behind)}
    rate = {name: both[name].get("download", {}).get("mbit_per_s") for name in (direct, behind)}
    single = {"direct": nat["via_direct"]["single_pass"], "relayed": nat["via_nat"]["single_pass"]}
    ratio = lambda a, b: a / b if a and b else None
    return {
        "from": nat["from"],
        "seconds_until_reachable": {name: found["seconds"] for name, found in nat["reachable_s"].items()},
        "announced": {name: found["reached"] for name, found in nat["reachable_s"].items()},
        "rtt_ms": {"direct": rtt[direct], "relayed": rtt[behind],
                   "through_the_relay": both[behind].get("relayed_rtt_ms", {}).get("median"),  # None: direct by then
                   "first_contact": {name: both[name]["rtt_ms"]["max"] for name in (direct, behind)}},
        "download_mbit_per_s": {"direct": rate[direct], "relayed": rate[behind]},
        "single_pass_seconds": {k: v["seconds"] for k, v in single.items()},
        "block_0_request_seconds": {k: v["seconds_per_block"]["0"] for k, v in single.items()},
        "ratios_relayed_over_direct": {
            "rtt": ratio(rtt[behind], rtt[direct]),
            "download_rate": ratio(rate[behind], rate[direct]),
            "single_pass_latency": ratio(single["relayed"]["seconds"], single["direct"]["seconds"]),
            "block_0_request_latency": ratio(single["relayed"]["seconds_per_block"]["0"],
                                             single["direct"]["seconds_per_block"]["0"]),
        },
        "bootstrap_bytes": {"while_block_0_was_direct": nat["bootstrap_bytes_via_direct"],
                            "while_block_0_was_behind_nat": nat["bootstrap_bytes_via_nat"],
                            "checkpoint_bytes_from_the_nated_host": both[behind].get("download", {}).get("bytes")},
        "between_peers_behind_nat": _nated_twin(from_behind_nat, behind),
    }  # fmt: skip


def _nated_twin(result: dict | None, name: str) -> dict | None:
    """The NATed twin as a client behind NAT too saw it: its route, round trips, download."""
    found = [p for p in (result or {}).get("peers", {}).values() if p["name"] == name]
    if not found:
        return None
    return {"route": found[0]["route"], "rtt_ms": found[0]["rtt_ms"]["median"],
            "through_the_relay_ms": found[0].get("relayed_rtt_ms", {}).get("median"),
            "download": found[0].get("download")}  # fmt: skip


def plot(runs: dict, summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients, peers = list(runs["from"]), list(runs["peers"])
    measured = {(c["from"], c["to"]): c["measured_ms"] or 0 for c in summary["rtt"]}
    grid = [[measured.get((c, p), 0) for p in peers] for c in clients]
    nat = summary.get("nat")
    fig, axes = plt.subplots(1, 4 if nat else 3, figsize=(22 if nat else 17, 5))
    heat, rate, gen = axes[:3]
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
            rate.hlines(
                figures["download_cap_mbit"], clients.index(client) - 0.3, clients.index(client) + 0.3, colors="r"
            )
    rate.set(title="checkpoint download rate per host (red: cap)", ylabel="Mbit/s")
    gen.bar(clients, [per_client[c]["single_pass_seconds"] for c in clients], label="single pass")
    ar = [per_client[c]["autoregressive_seconds"] or 0 for c in clients]
    if any(ar):
        gen.bar(clients, ar, alpha=0.4, label="autoregressive")
        gen.set_yscale("log")
    gen.set(title="generation latency from each region", ylabel="seconds")
    gen.legend()
    if nat:
        ratios = {k: v for k, v in nat["ratios_relayed_over_direct"].items() if v is not None}
        axes[3].bar(list(ratios), list(ratios.values()))
        axes[3].axhline(1.0, color="r", linestyle="--")
        axes[3].set(title=f"behind NAT over direct, from {nat['from']}", ylabel="ratio")
        axes[3].tick_params(axis="x", rotation=30)
    fig.tight_layout()
    write_picture(path, fig, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", default=str(Path(__file__).with_name("regions.yaml")))
    parser.add_argument("--peer-region", default="eu-west", help="region of the peers that host every block")
    parser.add_argument("--ar-region", default="home", help="client region that also times the autoregressive baseline")
    parser.add_argument("--gen-bytes", type=int, default=256)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument(
        "--steps-per-block", type=int, default=STEPS_PER_BLOCK, help="each block's denoising steps a span"
    )
    parser.add_argument("--peer-steps", type=int, default=12)
    parser.add_argument(
        "--nat-region", default="home-nat", help="a behind_nat region: block 0 hosted there and in --twin-region"
    )
    parser.add_argument("--twin-region", default="home", help="where the NATed host's direct twin sits")
    parser.add_argument("--nat-client", default="us-east", help="client region of the relayed vs direct comparison")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", default="benchmarks/results/regions")
    parser.add_argument("--from-json", default=None, help="summarize and plot the runs of an earlier regions.json")
    args = parser.parse_args()
    setup_logging()
    if args.from_json:
        earlier = json.loads(Path(args.from_json).read_text())
        regions, one_way_s = netlab.load_regions(Path(earlier["config"]["regions"]), nat=True)
        finish(earlier["config"], regions, one_way_s, earlier["runs"], Path(args.out))
        return
    if reason := netlab.available(delays=True):
        print(f"regions.py: error: {reason}", file=sys.stderr)
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the teardown on SIGTERM too
    regions, one_way_s = netlab.load_regions(Path(args.regions), nat=True)
    if any(r.get("behind_nat") for r in regions.values()) and (reason := netlab.available(nat=True)):
        print(f"regions.py: error: {reason}", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        runs = run(args, regions, one_way_s, Path(tmp))
    # settings, never this machine's paths: the regions file relative to the repository root
    root = Path(__file__).resolve().parent.parent
    config = {**vars(args), "regions": os.path.relpath(args.regions, root), "out": os.path.relpath(args.out, root)}
    finish(config, regions, one_way_s, runs, Path(args.out))


def finish(config: dict, regions: dict, one_way_s, runs: dict, out: Path) -> None:
    """Summary, PNG and JSON of a run."""
    summary = summarize(runs, regions, one_way_s)
    out.mkdir(parents=True, exist_ok=True)
    plot(runs, summary, out / "regions.png")
    result = {"config": config, "regions": regions, "summary": summary, "runs": runs}
    write_atomic(out / "regions.json", json.dumps(result, indent=2).encode())
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
