"""Fuzzing: malformed, huge, truncated, wrong-type and out-of-range messages sent to every P2P
handler of live peers, and the same kinds of input to every decoder of a peer's bytes in this
process; what each handler and decoder did with them.

Starts a bootstrap node and one `swarm-peer` per block of a small model on 127.0.0.1
(swarm/lab/fuzz_peers.py `fuzz_swarm`: every handler of ours is live), then sends `--messages`
raw messages spread over the handlers of both peers (`WEIGHTS`), `--concurrency` at a time per
handler and peer, each drawn by a seeded `Mutator` (swarm/lab/mutations.py) from the handler's
valid request: random bytes, bit flips, truncation, extension, huge length prefixes, fields of
the wrong type, out of range, NaN or inf, huge or deeply nested, and tensors of the wrong dtype
or shape, holding NaN or values out of range, or whose serialized fields lie; one message in
`--giant-every` is drawn with values of up to `--giant-bytes`, near libp2p's 4 MiB. Every
`--check-every` seconds each peer must answer a valid `rpc_info`. Then `--decoder-messages`
inputs to each decoder of swarm/lab/fuzz.py. The run stops at `--max-seconds` whatever it has
sent, stops every process it started, reads the peers' logs, and writes
benchmarks/results/fuzz/fuzz.json:
- per handler (both peers together): messages, answers, error replies, raised (the handler
  raised: hivemind sent its exception back), hangs (no answer within the handler's timeout),
  failed and not sent (our own end), and the strategies drawn;
- per decoder: messages, accepted, refused, and anything else (an exception of another type, a
  value out of bounds, a decode slower than `fuzz.SLOW_S`: each a bug);
- "crashes": handlers that raised, decoders that raised or went out of bounds, peers that died,
  tracebacks in the peers' logs; "hangs": calls not answered in time, health checks a peer
  failed, slow decodes; "findings": the first distinct ones, with what they said.

    python benchmarks/fuzz.py            # about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import tempfile
import time
import zlib
from pathlib import Path

from tqdm import tqdm

from swarm.cli.console import setup_logging
from swarm.files import write_atomic
from swarm.lab import fuzz, fuzz_peers
from swarm.lab.fuzz_peers import ERROR_REPLY, FAILED, HANG, NOT_SENT, RAISED, Target
from swarm.lab.mutations import Mutator
from swarm.model.denoiser import ModelConfig

logger = logging.getLogger("benchmarks.fuzz")

# each handler's share of the messages: the slow ones (a download cut short is answered when the
# host's wait for the rest ends; a payload poll waits for its step; a dial-back dials) get fewer
WEIGHTS = {"rpc_info": 1.0, "rpc_chunk_list": 1.5, "rpc_download": 0.4, "rpc_payload": 1.0, "rpc_denoise": 1.5,
           "rpc_stage": 1.2, "rpc_tokenizer": 1.0, "rpc_dial_back": 0.5, "rpc_dial_me": 1.0}  # fmt: skip
CONCURRENCY = {
    "rpc_download": 16,
    "rpc_payload": 5,
    "rpc_denoise": 2,
    "rpc_dial_back": 1,
}  # the peers' per-caller limits
FINDINGS_KEPT = 20
LOGGED_FAILURES = ("Traceback", "Unhandled exception", "exception was never retrieved")  # asyncio's and Python's


class Tally:
    """Outcomes by target name, the strategies drawn, the error replies hivemind made, and the first
    distinct findings."""

    def __init__(self) -> None:
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.strategies: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.envelopes: collections.Counter = collections.Counter()  # error replies hivemind made: no handler saw them
        self.findings: dict[str, dict] = {}

    def add(self, name: str, strategy: str, outcome: str, why: str = "") -> None:
        self.counts[name][outcome] += 1
        self.envelopes[name] += why == fuzz_peers.ENVELOPE
        self.strategies[name][strategy] += 1
        if outcome in (RAISED, HANG, FAILED) or outcome.startswith(("raised", "out of bounds", "slow")):
            key = f"{name}: {outcome.split(':')[0]}: {why[:80]}"
            if key not in self.findings and len(self.findings) < FINDINGS_KEPT:
                self.findings[key] = {"target": name, "outcome": outcome[:300], "why": why[:300], "strategy": strategy}


async def fuzz_handler(
    client, target: Target, handler, quota: int, args, tally: Tally, bar: tqdm, stop_at: float
) -> None:
    """`quota` messages to one handler of one peer, `CONCURRENCY` at a time, until `stop_at`."""
    seed = zlib.crc32(f"{args.seed} {handler.name} {target.host.block}".encode())
    mutator, giant = Mutator(seed, args.huge_bytes), Mutator(seed + 1, args.giant_bytes)
    sent = iter(range(quota))

    async def worker() -> None:
        for index in sent:
            if time.monotonic() >= stop_at:
                return
            drawing = giant if index % args.giant_every == args.giant_every - 1 else mutator
            strategy, data = drawn(drawing, handler)
            outcome, why = await fuzz_peers.send(client.p2p, target.host.peer_id, handler, data)
            tally.add(handler.name, strategy, outcome, why)
            bar.update(1)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY.get(handler.name, args.concurrency))))


def drawn(mutator: Mutator, handler) -> tuple[str, bytes]:
    """A mutation of the handler's valid request: of its envelope (framed, for a stream), or of a
    stream's frames as bytes (cut short, a length changed: the host waits for the rest)."""
    if handler.stream and mutator.rng.random() < 0.5:
        return mutator.of_bytes(handler.sample())
    strategy, request = mutator.of_envelope(handler.request)
    return (f"framed {strategy}", fuzz_peers.frames(request)) if handler.stream else (strategy, request)


async def watch(client, targets: list[Target], every: float, health: collections.Counter, stop: asyncio.Event) -> None:
    """Every `every` seconds, whether each peer answers a valid `rpc_info` and its process lives."""
    while not stop.is_set():
        for target in targets:
            health["checks"] += 1
            if target.process.process.poll() is not None:
                health[f"died: {target.process.name}"] += 1
            elif not await fuzz_peers.answers(client.p2p, target.host.peer_id):
                health[f"no answer: {target.process.name}"] += 1
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            pass


async def fuzz_live(client, targets: list[Target], args, tally: Tally) -> collections.Counter:
    """Every handler of every peer at once, each its share of `--messages`; the health checks beside."""
    total = sum(WEIGHTS.values()) * len(targets)
    stop_at, health, stop = time.monotonic() + args.max_seconds, collections.Counter(), asyncio.Event()
    watcher = asyncio.create_task(watch(client, targets, args.check_every, health, stop))
    with tqdm(total=args.messages, desc="messages to live peers", unit="msg", mininterval=5.0) as bar:
        quota = {name: round(args.messages * weight / total) for name, weight in WEIGHTS.items()}
        await asyncio.gather(*(fuzz_handler(client, target, handler, quota[handler.name], args, tally, bar, stop_at)
                               for target in targets for handler in target.handlers))  # fmt: skip
    stop.set()
    await watcher
    return health


def fuzz_decoders(config: ModelConfig, args, tally: Tally) -> None:
    """`--decoder-messages` mutated inputs to each decoder, in this process."""
    found = fuzz.decoders(config)
    mutator = Mutator(args.seed, args.huge_bytes)
    logging.getLogger("swarm").setLevel(logging.WARNING)  # a reader logs each record it ignores: thousands here
    for decoder in tqdm(found, desc="decoders", unit="decoder"):
        for _ in range(args.decoder_messages):
            strategy, data = fuzz.mutated(decoder, mutator)
            verdict = fuzz.judge(decoder, data)
            tally.add(decoder.name, strategy, verdict, verdict)


def log_findings(targets: list[Target]) -> dict[str, int]:
    """Tracebacks and unhandled exceptions in each peer's log (a stream handler that raised is logged there)."""
    return {t.process.name: sum(t.process.log().count(mark) for mark in LOGGED_FAILURES) for t in targets}


def handler_rows(tally: Tally, names: list[str]) -> dict:
    return {name: {"messages": sum(tally.counts[name].values()) - tally.counts[name][NOT_SENT],
                   "answers": tally.counts[name][fuzz_peers.ANSWER], "error_replies": tally.counts[name][ERROR_REPLY],
                   "of_them_envelopes_hivemind_refused": tally.envelopes[name],
                   "raised": tally.counts[name][RAISED], "hangs": tally.counts[name][HANG],
                   "failed": tally.counts[name][FAILED], "not_sent": tally.counts[name][NOT_SENT],
                   "strategies": dict(tally.strategies[name])} for name in names}  # fmt: skip


def decoder_rows(tally: Tally, names: list[str]) -> dict:
    rows = {}
    for name in names:
        counts = tally.counts[name]
        other = {k: v for k, v in counts.items() if k not in (fuzz.ACCEPTED, fuzz.REFUSED)}
        rows[name] = {"messages": sum(counts.values()), "accepted": counts[fuzz.ACCEPTED],
                      "refused": counts[fuzz.REFUSED], "other": other}  # fmt: skip
    return rows


def measure(args, workdir: Path) -> dict:
    tally = Tally()
    began = time.monotonic()
    with fuzz_peers.fuzz_swarm(workdir) as (_, client, targets):
        config = client.wait_for_model(60)
        live_began = time.monotonic()
        health = client.loop.run(fuzz_live(client, targets, args, tally), args.max_seconds + 120)
        live_seconds = time.monotonic() - live_began
        alive = {t.process.name: t.process.process.poll() is None for t in targets}
        logged = log_findings(targets)
    handler_names = sorted(WEIGHTS)
    decoder_began = time.monotonic()
    fuzz_decoders(config, args, tally)
    handlers, decoders = (
        handler_rows(tally, handler_names),
        decoder_rows(tally, sorted(set(tally.counts) - set(WEIGHTS))),
    )
    unhealthy = sum(v for k, v in health.items() if k.startswith("no answer"))
    decoder_bugs = sum(sum(v for k, v in d["other"].items() if not k.startswith("slow")) for d in decoders.values())
    slow = sum(sum(v for k, v in d["other"].items() if k.startswith("slow")) for d in decoders.values())
    live_messages, decoder_messages = (
        sum(h["messages"] for h in handlers.values()),
        sum(d["messages"] for d in decoders.values()),
    )
    return {
        "config": {**vars(args), "peer_options": fuzz_peers.PEER_OPTIONS, "weights": WEIGHTS},
        "model": config.to_dict(),  # its units too
        "messages": live_messages + decoder_messages,
        "live_messages": live_messages,
        "decoder_messages": decoder_messages,
        "crashes": sum(h["raised"] for h in handlers.values()) + decoder_bugs + list(alive.values()).count(False)
                   + sum(logged.values()),
        "hangs": sum(h["hangs"] for h in handlers.values()) + unhealthy + slow,
        "live_seconds": live_seconds,
        "live_messages_per_second": live_messages / live_seconds,
        "decoder_seconds": time.monotonic() - decoder_began,
        "seconds": time.monotonic() - began,
        "peers": {"alive_at_end": alive, "log_tracebacks": logged, "health_checks": health["checks"],
                  "health_failures": {k: v for k, v in health.items() if k != "checks"}},
        "handlers": handlers,
        "decoders": decoders,
        "findings": list(tally.findings.values()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="messages to the live peers' handlers")
    parser.add_argument("--decoder-messages", type=int, default=2_000, help="inputs to each decoder in this process")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="calls in flight per handler and peer (at most the peer's limit for some)",
    )
    parser.add_argument("--max-seconds", type=float, default=900.0, help="stop sending to the peers after this long")
    parser.add_argument("--check-every", type=float, default=2.0, help="seconds between health checks of each peer")
    parser.add_argument("--huge-bytes", type=int, default=64 * 1024, help="the size of a huge value")
    parser.add_argument(
        "--giant-bytes", type=int, default=3_900_000, help="the size of a giant value (libp2p's cap: 4 MiB)"
    )
    parser.add_argument("--giant-every", type=int, default=1000, help="one message in this many has a giant value")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/fuzz")
    args = parser.parse_args()
    setup_logging()
    logging.getLogger("hivemind").setLevel(logging.ERROR)  # msgpack's unknown ext types, warned once per message
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args, Path(tmp))
    out = Path(args.out)
    write_atomic(out / "fuzz.json", (json.dumps(result, indent=2) + "\n").encode())
    logger.info("%d messages (%d to live peers, %d to decoders): %d crashes, %d hangs", result["messages"],
                result["live_messages"], result["decoder_messages"], result["crashes"], result["hangs"])  # fmt: skip
    print(json.dumps({k: result[k] for k in ("messages", "live_messages", "decoder_messages", "crashes", "hangs")}))


if __name__ == "__main__":
    main()
