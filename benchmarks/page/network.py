"""The swarm as a network: serving, checkpoint transfer, emulated regions and NAT, latency as B grows,
discovery, chaos, and the health page."""

from __future__ import annotations

from .formatting import command, fixed, percent, plain, section, settings, size, table, targets_table, times, yes
from .reading import Folder, Node


def serve(folder: Folder) -> list[str]:
    s = folder.json("serve.json")
    rows = []
    for length, run in s["lengths"].items():
        single, ar = run["single_pass"], run["autoregressive"]
        rows.append([length, fixed(single.num("median_seconds")), plain(single["hops"]),
                     fixed(ar.num("median_seconds")), plain(ar["hops"]),
                     times(run.num("latency_ratio_autoregressive_over_single_pass"))])  # fmt: skip
    defences = s["defences"]
    checked = (f"Cross-checking replicas cost {fixed(defences.num('extra_requests_per_request'))} extra requests per "
               f"request and {percent(defences.num('cross_check_seconds_over_request_seconds'))} of the request time, "
               f"with {plain(defences['cross_check']['disagreements'])} disagreements.")  # fmt: skip
    options = {"lengths": s["lengths"].names(), "steps_per_block": s["steps_per_block"]}
    header = ["bytes", "single-pass s", "hops", "autoregressive s", "hops", "autoregressive / single-pass"]
    return section(
        "Starts a bootstrap node and peers for every block (separate processes on 127.0.0.1) and times "
        "generating each length single-pass (one trip through the blocks per span) against an autoregressive "
        "pipeline over the same peers (one trip through every stage per byte); every block has two replicas "
        "of one checkpoint, so the client cross-checks them.",
        command("serve.py", options),
        f"Settings: `n_blocks` {s['n_blocks']}, `gen_len` {s['gen_len']}.",
        table(header, rows),
        checked,
        folder.pictures(),
    )


TRANSFER_COLUMNS = ["case", "MB", "hosts", "seconds", "Mbit/s", "over cap", "cpu_steal"]


def transfer(folder: Folder) -> list[str]:
    t = folder.json("transfer.json")
    config = t["config"]
    rows, ratios = [], []
    for scenario in config["scenarios"]:
        for case, run in t[scenario].items():
            if isinstance(run, Node) and "mbit_per_s" in run.names():
                rows.append(transfer_row(f"{scenario}: {case}", run))
            elif case.endswith(("_over_plain_tcp", "_over_clean")):
                ratios.append(f"`{case}` {times(run)}")
    corrupt = t.get("corrupt")
    verdict = (f" A corrupting host was dropped in every run: {yes(corrupt['corrupt_host_dropped_every_run'])}; "
               f"liars served nothing: {yes(corrupt['liars_served_nothing'])}.") if corrupt else ""  # fmt: skip
    return section(
        "Downloads a checkpoint through emulated links (network namespaces, `tc` caps and delays) from several "
        "hosts at once, from one host over a long fat link beside one plain TCP connection on the same link, and "
        "from hosts of which one corrupts or forges chunks. `over cap` is the rate over the link's cap; "
        "`cpu_steal` is the share of CPU the hypervisor gave other guests meanwhile.",
        command("transfer.py", {"scenarios": config["scenarios"]}, root=True),
        settings(config, {"scenarios"}),
        table(TRANSFER_COLUMNS, rows),
        f"Ratios: {', '.join(ratios)}.{verdict}" if ratios else verdict,
        targets_table(t["targets"], "value", "holds"),
        folder.pictures(),
    )


def transfer_row(case: str, run: Node) -> list[str]:
    return [case, fixed(run.num("bytes") / 1e6, 1), plain(run["hosts"]), fixed(run.num("seconds"), 2),
            fixed(run.num("mbit_per_s"), 1), fixed(run.num("over_cap")), fixed(run.get("cpu_steal"), 2)]  # fmt: skip


def regions(folder: Folder) -> list[str]:
    r = folder.json("regions.json")
    summary = r["summary"]
    rows = [[region, fixed(c.num("single_pass_seconds"), 2), plain(c["single_pass_bytes"]),
             fixed(c.num("slowest_download_over_cap")), times(c.num("latency_ratio_autoregressive_over_single_pass"))]
            for region, c in summary["per_client_region"].items()]  # fmt: skip
    return section(
        "Builds regions from `benchmarks/regions.yaml` (a network namespace per process, a router that delays "
        "each packet by its regions' one-way delay, link caps), starts a swarm there and runs `swarm-bench "
        "latency` from a client in every region; a host of block 0 then joins behind a home router (NAT) beside "
        "its twin without NAT, and the client compares them with every other host of block 0 stopped.",
        command("regions.py", {}, root=True), settings(r["config"]),
        "Round trips between regions within 10% of the configured ones: "
        f"{plain(summary['inter_region_rtts_within_10_percent'])}.",
        table(["client region", "single-pass s", "bytes", "slowest download / cap", "autoregressive / single-pass"],
              rows),
        nat(summary["nat"]), folder.pictures(),
    )  # fmt: skip


def nat(n: Node) -> list[str]:
    """Relayed (the host behind NAT) against direct (its twin), for block 0 from the same client."""
    announced = n["announced"]  # twin -> "direct" or "relayed"
    by_twin = {
        "seconds until reachable": n["seconds_until_reachable"],
        "first contact ms": n["rtt_ms"]["first_contact"],
    }
    by_kind = {
        "round trip ms": n["rtt_ms"],
        "download Mbit/s": n["download_mbit_per_s"],
        "single pass s": n["single_pass_seconds"],
        "block 0 request s": n["block_0_request_seconds"],
    }
    rows = [
        [label, *(fixed(node.num(twin), 2) for twin in sorted(announced.names(), key=announced.__getitem__))]
        for label, node in by_twin.items()
    ]  # direct sorts before relayed
    rows += [[label, fixed(node.num("direct"), 2), fixed(node.num("relayed"), 2)] for label, node in by_kind.items()]
    ratios = ", ".join(f"{k.replace('_', ' ')} {times(v)}" for k, v in n["ratios_relayed_over_direct"].items())
    bootstrap, between = n["bootstrap_bytes"], n["between_peers_behind_nat"]
    return [f"Behind NAT, from {plain(n['from'])}:", ""] + table(["", "direct", "relayed"], rows) + [
        (f"Relayed over direct: {ratios}. The bootstrap (the only relay) moved "
         f"{size(bootstrap.num('while_block_0_was_behind_nat'))} while block 0 was behind NAT and "
         f"{size(bootstrap.num('while_block_0_was_direct'))} while it was direct. Between two hosts behind the same "
         f"router the direct route is `{plain(between['route'])}`: {fixed(between.num('rtt_ms'), 0)} ms round trip "
         "through the relay."), ""]  # fmt: skip


def blocks_latency(folder: Folder) -> list[str]:
    r = folder.json("blocks_latency.json")
    summary, config = r["summary"], r["config"]
    rows = [[plain(place), plain(b), fixed(row.num("rtt_ms_median"), 1), fixed(row.num("single_pass_seconds"), 2),
             plain(row["single_pass_hops"]), fixed(row.num("autoregressive_seconds"), 1),
             plain(row["autoregressive_hops"]),
             times(row.num("ratio_autoregressive_over_single_pass")), fixed(row.num("fetch_seconds"), 1),
             size(row.num("model_bytes"))]
            for place, per_b in summary["places"].items() for b, row in per_b.items()]  # fmt: skip
    header = ["place", "B", "round trip ms", "single-pass s", "hops", "autoregressive s", "hops",
              "autoregressive / single-pass", "swarm-fetch s", "model"]  # fmt: skip
    return section(
        "The default model's layers split into B blocks, each B its own swarm: the bootstrap and one peer per block in "
        f"{plain(config['peer_region'])}, a client in {plain(config['client_region'])} (emulated regions as above), "
        "and again on 127.0.0.1 where `loopback` rows are shown. From the client: "
        "`swarm-bench latency --autoregressive` "
        "(single-pass generation at the steps per block given, B requests a span, against the autoregressive pipeline "
        "with B stages, B requests a byte) and the wall time of `swarm-fetch` assembling the model (its start, "
        "downloads and spot checks included).",
        command("blocks_latency.py", {}, root=True),
        settings(config),
        settings(r["models"][r["models"].names()[0]], {"n_blocks"}, label="Model, each B alike but for `n_blocks`"),
        table(header, rows),
        targets_table(summary["targets"]),
        f"The whole run took {fixed(r.num('seconds') / 60, 1)} minutes.",
        folder.pictures(),
    )


def discovery(folder: Folder) -> list[str]:
    d = folder.json("discovery.json")
    rows = [[plain(s["nodes"]), fixed(s["lookup_rpcs"].num("median"), 0), fixed(s["lookup_rpcs"].num("p95"), 0),
             fixed(s["lookup_round_trips"].num("median"), 0), fixed(s["lookup_round_trips"].num("p95"), 0),
             fixed(s["lookup_round_trips"].num("max"), 0), fixed(s["lookup_seconds"].num("median"), 2),
             fixed(s["every_block_seconds"].num("median"), 2), fixed(s["visibility_periods"].num("median"), 2),
             fixed(s["visibility_periods"].num("max"), 2), fixed(s.num("hosts_found_min"), 2)]
            for s in d["sizes"]]  # fmt: skip
    header = ["nodes", "find RPCs median", "p95", "round trips median", "p95", "max", "one block s", "every block s",
              "seen after (periods) median", "max", "share of hosts found (min)"]  # fmt: skip
    network = d["network"]
    placed = f"Placement: {plain(network['placement'])}" + (
        f" ({plain(network['regions'])})." if network.get("regions") else "."
    )
    return section(
        "Grows a swarm of real hivemind DHT nodes, each announcing a block as peers do (a signed entry every "
        "announce period), and measures fresh clients' lookups of every block (find RPCs and round trips traced "
        "inside the client's DHT process) and how many announce periods pass before a new announcement is seen "
        "from another region.",
        command("discovery.py", {"sizes": d["config"]["sizes"]}, root=True), settings(d["config"], {"sizes"}),
        placed, table(header, rows), targets_table(d["targets"]), folder.pictures(),
    )  # fmt: skip


CHAOS_COUNTS = ("killed_sigkill", "killed_sigterm", "restarted_in_place", "started_fresh", "hangs", "steps_lost",
                "fetches_tried", "fetches_succeeded", "torn_checkpoints", "checkpoints_checked",
                "samples_with_a_block_down")  # fmt: skip


def chaos(folder: Folder) -> list[str]:
    c = folder.json("chaos.json")
    calm, storm = c["calm"], c["chaos"]
    rows = [["calm", fixed(calm.num("seconds_to_finish"), 0), fixed(calm.num("denoise_ce"))],
            ["chaos", fixed(storm.num("seconds_to_finish"), 0), fixed(storm.num("denoise_ce"))]]  # fmt: skip
    counts = [[k.replace("_", " "), plain(storm[k])] for k in CHAOS_COUNTS] + [
        ["blocks lost", str(len(storm["blocks_lost"].data))]
    ]
    config = c["config"]
    return section(
        "Runs a small swarm calm, then again while a random peer is killed (SIGKILL or SIGTERM) and replaced every "
        "few seconds, fetching the model meanwhile, and compares the two.",
        command("chaos.py", {"duration": config["duration"]}), settings(config, {"duration"}),
        table(["run", "seconds to finish", "denoise_ce"], rows),
        f"Denoising CE, chaos over calm: {times(c.num('denoise_ce_chaos_over_calm'))}.",
        table(["during the chaos", "count"], counts), folder.pictures(),
    )  # fmt: skip


def health(folder: Folder) -> list[str]:
    state = folder.json("state.json")
    blocks = list(state["blocks"])
    verified = sum(b["verified"] for b in blocks)
    shown = (f"The page showed the swarm `{plain(state['status'])}`: {sum(b['healthy'] for b in blocks)} of "
             f"{plain(state['n_blocks'])} blocks healthy, {verified} verified hosts, "
             f"{len(state['pings'].data)} round trips between peers (`state.json` holds what it showed).")  # fmt: skip
    pictures = [f"![the health page]({folder.rel}/{p.name})" for p in sorted(folder.path.glob("*.png"))]
    return section(
        "Runs `swarm-demo`, waits until its health page shows every block healthy with a few loss points, and "
        "takes a screenshot in headless Chromium.",
        command("health_page.py", {}) + " (its settings are not recorded in the results)",
        shown,
        *pictures,
    )
