"""Serving latency: single-pass generation through the block peers vs an autoregressive pipeline.

Both run over the same peers and the same P2P transport: single pass makes one trip through
the B block peers per G bytes; the autoregressive pipeline (the byte transformer split into B
stages, stage b on the peer of block b) makes one trip through all B stages per byte.

By default it starts its own swarm on 127.0.0.1 (a bootstrap node and one peer per block,
separate processes, each training a couple of steps and then only serving). With
--initial-peers it measures a swarm that is already running (its peers must have been
started with --serve-ar-stage for the autoregressive side).

    python benchmarks/serve.py --lengths 64 256
    python benchmarks/serve.py --steps-per-block 4 --config hop.json   # hop.json: {"prefix_cache": true}
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from swarm.cli.console import setup_logging
from swarm.files import write_atomic
from swarm.lab.launch import LocalSwarm
from swarm.model.generate import continue_text
from swarm.p2p.client import SwarmClient
from swarm.p2p.network import EventLoopThread, NetworkOptions
from swarm.serving.ar_pipeline import generate_autoregressive
from swarm.serving.remote import RemoteBlocks
from swarm.waiting import wait_for

logger = logging.getLogger("benchmarks.serve")

PROMPT = b"The history of the city begins with"
REQUEST_TIMEOUT_S = 60.0


def single_pass(runner: RemoteBlocks, config, length: int, steps_per_block: int) -> dict:
    before = runner.round_trips
    started = time.perf_counter()
    text = b"".join(continue_text(runner, config, PROMPT, length, steps_per_block))
    seconds = time.perf_counter() - started
    hops = runner.round_trips - before
    return {"seconds": seconds, "hops": hops, "trips_through_swarm": hops // config.n_blocks, "bytes": len(text)}


def autoregressive(loop: EventLoopThread, p2p, stage_peers: list[str], config, length: int) -> dict:
    started = time.perf_counter()
    _, hops = generate_autoregressive(loop, p2p, stage_peers, config, PROMPT, length, REQUEST_TIMEOUT_S)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "hops": hops, "trips_through_swarm": hops // len(stage_peers), "bytes": length}


def measure(client: SwarmClient, lengths: list[int], repeats: int, steps_per_block: int) -> dict:
    config = client.wait_for_model(30)
    runner = RemoteBlocks(client.directory, client.p2p, client.loop, config, request_timeout=REQUEST_TIMEOUT_S)
    loop, p2p = client.loop, client.p2p
    stage_peers = [runner.choose(block).peer_id for block in range(config.n_blocks)]
    pings = {peer: statistics.median(runner.ping(peer) for _ in range(5)) for peer in stage_peers}
    result = {
        "model": config.to_dict(),  # the swarm's, as its record gives it: the units it counts in too
        "n_blocks": config.n_blocks,
        "gen_len": config.gen_len,
        "steps_per_block": steps_per_block,
        "prefix_cache": config.prefix_cache,
        "ping_ms": {f"block {b}": 1000 * pings[peer] for b, peer in enumerate(stage_peers)},
        "lengths": {},
    }
    for length in lengths:
        runs = {"single_pass": [], "autoregressive": []}
        for _ in range(repeats):
            runs["single_pass"].append(single_pass(runner, config, length, steps_per_block))
            runs["autoregressive"].append(autoregressive(loop, p2p, stage_peers, config, length))
        result["lengths"][str(length)] = summarize(runs)
    single_pass_seconds = sum(sum(t) for t in runner.hop_seconds.values())
    result["defences"] = {  # what checking replicas against each other cost the single-pass runs
        "cross_check": vars(runner.checks),
        "extra_requests_per_request": runner.checks.extra_requests / max(1, runner.round_trips),
        "cross_check_seconds_over_request_seconds": runner.checks.seconds / max(1e-9, single_pass_seconds),
    }
    return result


def summarize(runs: dict) -> dict:
    out = {}
    for name, samples in runs.items():
        seconds = statistics.median(s["seconds"] for s in samples)
        out[name] = {
            "median_seconds": seconds,
            "hops": samples[0]["hops"],
            "trips_through_swarm": samples[0]["trips_through_swarm"],
            "seconds_per_hop": seconds / samples[0]["hops"],
        }
    out["latency_ratio_autoregressive_over_single_pass"] = (
        out["autoregressive"]["median_seconds"] / out["single_pass"]["median_seconds"]
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--initial-peers", nargs="*", default=None, help="measure this running swarm instead")
    parser.add_argument("--swarm", default="servebench")
    parser.add_argument("--config", default=None, help="model config JSON for the local swarm; "
                        '{"prefix_cache": true} times the cheap hop: the prefix encoded once per request, '
                        "not at each step (no quality cost seen at 150 or 300 training steps: "
                        "docs/decisions.md)")  # fmt: skip
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-per-block", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=2, help="peers per block (replicas cross-check each other)")
    parser.add_argument("--out", default="benchmarks/results/serve")
    args = parser.parse_args()
    setup_logging()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalSwarm(Path(tmp), swarm=args.swarm, config_path=args.config and str(Path(args.config).resolve())) as local,
    ):
        initial_peers = args.initial_peers or local.start_bootstrap()
        result = run_client(args, local, initial_peers, start_peers=not args.initial_peers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "serve.json", json.dumps(result, indent=2).encode())
    print(json.dumps(result, indent=2))


def start_replicas(args, local: LocalSwarm, client: SwarmClient) -> None:
    """`--replicas` serving peers per block: the first trains 2 steps, the others start from its
    checkpoint, so that a block's replicas announce one checkpoint and can check each other."""
    n_blocks = client.wait_for_model(30).n_blocks
    extra = ["--max-steps", "2", "--save-every", "2", "--announce-period", "2", "--serve-ar-stage"]
    for replica in range(args.replicas):
        for block in range(n_blocks):
            local.start_peer(f"peer{block}r{replica}", str(block), extra)

        def served(replica: int = replica) -> bool:  # this round's count, bound now
            hosts = client.directory.all_hosts(n_blocks)
            return all(sum(h.announcement.state == "serving" for h in hs) > replica for hs in hosts.values())

        wait_for(served, 300, f"{replica + 1} serving replicas per block")


def run_client(args, local: LocalSwarm, initial_peers: list[str], start_peers: bool) -> dict:
    """Join as a client; on a local swarm first start one serving peer per block and wait for them."""
    with SwarmClient(args.swarm, NetworkOptions(initial_peers=initial_peers)) as client:
        if start_peers:
            start_replicas(args, local, client)
        return measure(client, args.lengths, args.repeats, args.steps_per_block)


if __name__ == "__main__":
    main()
