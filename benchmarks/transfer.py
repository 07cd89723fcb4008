"""Many-source checkpoint downloads through emulated links: rate against the joiner's link cap,
and the cost of a host that serves corrupt chunks.

Every scenario builds its own `NetLab`: a namespace for the joiner and one per host, `tbf` caps
on their links, and the router's delay line between the joiner's region and the hosts'. Hosts
are `CheckpointHost`s (real DHT nodes and libp2p daemons, their services driven from this
process); each download is made by a fresh client in the joiner's namespace (a client-mode
DHT node and its daemon, as `swarm-fetch` or a joining peer starts), through
`swarm.checkpoints.download.download` from every host given, as `choose_checkpoint` does.
- quarters: a joiner with a downlink of `--downlink` (20 Mbit/s, the home region of
  regions.yaml) and 4 hosts with an uplink of a quarter of it each, 100 ms round trip (home to
  eu-west); beside it, the same checkpoint from one of those hosts alone (what a one-source
  download gives).
- long-fat: one host and the joiner at 100 Mbit/s, 80 ms round trip (us-east to eu-west);
  beside each download, in turn, the baseline: the same bytes over one plain TCP connection
  between the same namespaces, made fresh (`plain_tcp_*`: what one connection gets through
  these links, handshake and slow start included); the large payload again with the hosts and
  the joiner on bbr (`--compare-congestion`).
- corrupt: 4 hosts with half the joiner's downlink each (so that three of them can still fill
  it); all honest, against one that flips a byte of every chunk it sends (`CorruptChunks`,
  the honest chunk list), and one that also forges its list to match. The runs alternate.
Payloads: the size of the default model's block checkpoint (about 10 MB), and for rates a
larger one of `--seconds` at the cap: a download pays a fixed start (a new client's libp2p
connections, the owner check and chunk list round trips, TCP slow start: about 0.5-1 s here)
that a 10 MB file at 100 Mbit/s (0.8 s) cannot amortize, so the large payload measures the
rate the streams keep up, and both are reported. A rate is the payload over the wall time of
`download()` (whole: set-up included) and from the first stream's header to the last byte
(transfer). Every namespace runs cubic (`--congestion`), the default of the home and desktop
systems the peers stand for, not whatever this machine's kernel defaults to: where that is
bbr, one long flow through a queue stalls for ~0.3 s every 10 s (ProbeRTT), which the bbr
comparison row shows. Each run records the share of this machine's CPU time that the
hypervisor gave to other guests meanwhile (`cpu_steal`), since the lab's rates fall with it.
Needs root, iptables and NetfilterQueue (see .ci/regions-setup).

    python benchmarks/transfer.py            # about 6 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import random
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hivemind.utils.mpfuture import MPFuture

from swarm.checkpoints.download import Downloaded, download
from swarm.checkpoints.transfer import BlockServicer, max_checkpoint_bytes
from swarm.cli.console import setup_logging
from swarm.errors import SwarmError
from swarm.files import write_atomic, write_picture
from swarm.lab import netlab
from swarm.lab.attacks import CorruptChunks
from swarm.lab.hosting import CheckpointHost
from swarm.model.denoiser import ModelConfig
from swarm.p2p.client import SwarmClient
from swarm.p2p.network import NetworkOptions
from swarm.p2p.records import CheckpointInfo

logger = logging.getLogger("benchmarks.transfer")

SWARM = "transfer"
TARGET_OVER_CAP = 0.90
TARGET_CORRUPT_OVER_CLEAN = 1.1
DOWNLOAD_TIMEOUT_S = 600.0
# /proc/stat's steal column: time this virtual machine's CPUs were ready and ran another guest.
# A download's two ends, their daemons and the delay line share this machine's cores, so a run
# is slower while the hypervisor takes their time; each run records the share taken (`cpu_steal`).
STEAL = 7
SERVICERS = {"honest": BlockServicer, "corrupt": CorruptChunks,
             "forged": functools.partial(CorruptChunks, forge_list=True)}


class Links:
    """A lab of one joiner and some hosts (each host its own namespace), capped and delayed."""

    def __init__(self, lab: netlab.NetLab, folder: Path, down_mbit: float, host_up_mbit: list[float], rtt_s: float,
                 congestion: str):  # fmt: skip
        self.lab, self.folder, self.down_mbit = lab, folder, down_mbit
        lab.set_congestion(congestion)
        self.joiner = lab.add_node("joiner", "joiner")
        lab.cap(self.joiner, None, down_mbit)
        self.nodes = [lab.add_node(f"h{i}", "hosts") for i in range(len(host_up_mbit))]
        for node, up in zip(self.nodes, host_up_mbit):
            lab.cap(node, up, None)
        lab.start_delays(lambda a, b: 0.0 if a == b else rtt_s / 2)
        self.hosts: list[CheckpointHost] = []

    def start_hosts(self, kinds: list[str]) -> list[CheckpointHost]:
        """Hosts of the given kinds ("honest", "corrupt", "forged") on the lab's host nodes, replacing any before."""
        self.close_hosts()
        self.hosts = [CheckpointHost(self.folder / f"{node.namespace}-{kind}", SWARM, servicer=SERVICERS[kind],
                                     where=node)
                      for node, kind in zip(self.nodes, kinds)]  # fmt: skip
        return self.hosts

    def close_hosts(self) -> None:
        for host in self.hosts:
            host.close()
        self.hosts = []

    def hold(self, payload: bytes) -> CheckpointInfo:
        """Every current host keeps `payload` as a checkpoint (its chunk list is computed on the first request)."""
        infos = {host.put(payload, step=len(payload)) for host in self.hosts}
        assert len(infos) == 1, infos
        return infos.pop()

    def fetch(self, payload: bytes, info: CheckpointInfo, hosts: list[CheckpointHost]) -> dict:
        """A fresh joiner downloads `payload` (held as `info`) from `hosts`: its figures."""
        network = NetworkOptions(initial_peers=[m for h in hosts for m in h.maddrs],
                                 host_maddrs=[f"/ip4/{self.joiner.address}/tcp/0"])
        with contextlib.ExitStack() as stack:
            with self.joiner.inside():
                client = stack.enter_context(SwarmClient(SWARM, network))
            timings, started = {}, time.perf_counter()
            coro = download(client.p2p, [host.host(info) for host in hosts], show_progress=False, timings=timings)
            got: Downloaded = client.run(coro, DOWNLOAD_TIMEOUT_S)
            ended = time.perf_counter()
        assert got.data == payload
        return {"bytes": len(payload), "hosts": len(hosts), "seconds": ended - started,
                "mbit_per_s": 8 * len(payload) / (ended - started) / 1e6,
                "transfer_mbit_per_s": 8 * len(payload) / (ended - timings["header"]) / 1e6,
                "served_mb": [got.served.get(h.peer_id, 0) / 1e6 for h in hosts],
                "dropped": {i: got.dropped[h.peer_id]
                            for i, h in enumerate(hosts) if h.peer_id in got.dropped}}  # fmt: skip


    def plain_tcp(self, payload: bytes) -> dict:
        """The baseline: `payload` from the first host's namespace to the joiner's over one fresh
        TCP connection, from this process as the download's ends are (the handshake and slow start
        included): what any protocol over one connection can get through these links."""
        host = self.nodes[0]
        with host.inside():
            server = socket.create_server((host.address, 0))
        with self.joiner.inside():
            client = socket.socket()
        failed: list[BaseException] = []

        def send(connection: socket.socket) -> None:
            try:
                with connection:
                    connection.sendall(payload)
            except OSError as error:
                failed.append(error)

        with server, client:
            for end in (server, client):
                end.settimeout(DOWNLOAD_TIMEOUT_S)
            started, received = time.perf_counter(), 0
            client.connect(server.getsockname())
            connection = server.accept()[0]
            connection.settimeout(DOWNLOAD_TIMEOUT_S)
            sender = threading.Thread(target=send, args=(connection,), name="plain-tcp-sender", daemon=True)
            sender.start()
            while data := client.recv(1 << 20):
                received += len(data)
            ended = time.perf_counter()
            sender.join(DOWNLOAD_TIMEOUT_S)
        if failed or received != len(payload):
            raise SwarmError(f"plain TCP through the lab moved {received} of {len(payload)} bytes: {failed}")
        rate = 8 * received / (ended - started) / 1e6
        return {"bytes": received, "hosts": 1, "seconds": ended - started, "mbit_per_s": rate,
                "transfer_mbit_per_s": rate}


@contextlib.contextmanager
def links(folder: Path, down_mbit: float, host_up_mbit: list[float], rtt_s: float, congestion: str) -> Iterator[Links]:
    with netlab.NetLab("bswxfer") as lab:
        made = Links(lab, folder, down_mbit, host_up_mbit, rtt_s, congestion)
        try:
            yield made
        finally:
            made.close_hosts()


def payload(megabytes: float, seed: int) -> bytes:
    return random.Random(seed).randbytes(int(megabytes * 1e6))


def cpu_times() -> list[int]:
    """This machine's CPU time so far, by kind (/proc/stat's first line)."""
    # guest time is in user's
    return [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def alternating(measures: dict[str, Callable[[], dict]], repeats: int) -> dict[str, dict]:
    """Each of `measures` (name: a function measuring one run), in turn, `repeats` times (so that
    what the machine does meanwhile falls on all of them alike): every run, and the median of
    each figure, by name."""
    runs: dict[str, list[dict]] = {name: [] for name in measures}
    for i in range(repeats):
        for name, measure in measures.items():
            before = cpu_times()
            runs[name].append(measure())
            spent = [after - then for after, then in zip(cpu_times(), before)]
            run = runs[name][-1]
            run["cpu_steal"] = spent[STEAL] / max(1, sum(spent))
            logger.info("%s, run %d: %.2f s, %.1f Mbit/s, CPU stolen %.0f%%", name, i + 1, run["seconds"],
                        run["mbit_per_s"], 100 * run["cpu_steal"])  # fmt: skip
    figures = ("seconds", "mbit_per_s", "transfer_mbit_per_s", "cpu_steal")
    return {name: {**{k: statistics.median(r[k] for r in rs) for k in figures}, "bytes": rs[0]["bytes"],
                   "hosts": rs[0]["hosts"], "runs": rs}
            for name, rs in runs.items()}  # fmt: skip


def repeated(measure, repeats: int, what: str) -> dict:
    """`measure()` `repeats` times: every run, and the median of each figure."""
    return alternating({what: measure}, repeats)[what]


def with_cap(figures: dict, cap_mbit: float) -> dict:
    return {**figures, "cap_mbit": cap_mbit, "over_cap": figures["mbit_per_s"] / cap_mbit,
            "transfer_over_cap": figures["transfer_mbit_per_s"] / cap_mbit}  # fmt: skip


def quarters(args, folder: Path, sizes: dict) -> dict:
    down = args.downlink
    with links(folder, down, [down / 4] * 4, args.home_rtt_ms / 1000, args.congestion) as lab:
        hosts = lab.start_hosts(["honest"] * 4)
        result = {}
        for name, size_mb in (("default", sizes["default"]), ("large", down * args.seconds / 8)):
            data = payload(size_mb, seed=1)
            info = lab.hold(data)
            fetch = functools.partial(lab.fetch, data, info, hosts)
            result[f"four_hosts_{name}"] = with_cap(repeated(fetch, args.repeats, f"4 hosts, {name}"), down)
            if name == "default":  # the baseline: what one of them gives alone
                fetch_one = functools.partial(lab.fetch, data, info, hosts[:1])
                result["one_host_default"] = with_cap(repeated(fetch_one, 1, "1 host, default"), down)
    return {"downlink_mbit": down, "host_uplink_mbit": down / 4, "rtt_ms": args.home_rtt_ms, **result}


def long_fat(args, folder: Path, sizes: dict) -> dict:
    """One host at the joiner's cap; then the large payload again with `--compare-congestion`
    at both ends (hosts restarted: a socket keeps the algorithm it was made with)."""
    cap = args.fat_mbit
    with links(folder, cap, [cap], args.fat_rtt_ms / 1000, args.congestion) as lab:
        hosts = lab.start_hosts(["honest"])
        result = {}
        for name, size_mb in (("default", sizes["default"]), ("large", cap * args.seconds / 8)):
            data = payload(size_mb, seed=2)
            info = lab.hold(data)
            runs = alternating({f"one_host_{name}": functools.partial(lab.fetch, data, info, hosts),
                                f"plain_tcp_{name}": functools.partial(lab.plain_tcp, data)}, args.repeats)  # fmt: skip
            result.update({key: with_cap(figures, cap) for key, figures in runs.items()})
            result[f"one_host_{name}_over_plain_tcp"] = (runs[f"one_host_{name}"]["mbit_per_s"]
                                                         / runs[f"plain_tcp_{name}"]["mbit_per_s"])
        for other in args.compare_congestion:
            lab.lab.set_congestion(other)
            hosts = lab.start_hosts(["honest"])
            info = lab.hold(data)
            what = f"long fat link, large, {other}"
            fetch = functools.partial(lab.fetch, data, info, hosts)
            result[f"one_host_large_{other}"] = with_cap(repeated(fetch, args.repeats, what), cap)
    return {"link_mbit": cap, "rtt_ms": args.fat_rtt_ms, "congestion": args.congestion, **result}


def corrupt(args, folder: Path, sizes: dict) -> dict:
    """Clean, corrupt and forged runs in turn, on the same links with the same payload: 4 honest
    hosts, or the first of them replaced by a liar."""
    down = args.downlink
    data = payload(down * args.seconds / 8, seed=3)
    runs: dict[str, list[dict]] = {"clean": [], "corrupt": [], "forged": []}
    with links(folder, down, [down / 2] * 6, args.home_rtt_ms / 1000, args.congestion) as lab:
        *honest, liar, forger = lab.start_hosts(["honest"] * 4 + ["corrupt", "forged"])
        info = lab.hold(data)
        chosen = {"clean": honest, "corrupt": [liar, *honest[1:]], "forged": [forger, *honest[1:]]}
        for repeat in range(args.repeats):
            for kind, hosts in chosen.items():
                sent = getattr(hosts[0].servicer, "sent", 0)
                runs[kind].append(lab.fetch(data, info, hosts))
                runs[kind][-1]["chunks_the_first_host_sent"] = getattr(hosts[0].servicer, "sent", 0) - sent
                logger.info("%s, run %d: %.2f s", kind, repeat + 1, runs[kind][-1]["seconds"])
    median = {kind: statistics.median(r["seconds"] for r in rs) for kind, rs in runs.items()}
    return {"downlink_mbit": down, "host_uplink_mbit": down / 2, "rtt_ms": args.home_rtt_ms, "bytes": len(data),
            "median_seconds": median, "corrupt_over_clean": median["corrupt"] / median["clean"],
            "forged_over_clean": median["forged"] / median["clean"],
            "corrupt_host_dropped_every_run": all(0 in r["dropped"] for r in runs["corrupt"]),
            "liars_served_nothing": all(r["served_mb"][0] == 0 for kind in ("corrupt", "forged") for r in runs[kind]),
            "runs": runs}  # fmt: skip


SCENARIOS = {"quarters": quarters, "long_fat": long_fat, "corrupt": corrupt}


def targets(result: dict) -> dict:
    q, f, c = result.get("quarters"), result.get("long_fat"), result.get("corrupt")
    checks = {}
    if q:
        over_cap = q["four_hosts_large"]["over_cap"]
        checks["four_quarter_hosts_over_cap"] = {"value": over_cap, "target": f">= {TARGET_OVER_CAP}",
                                                 "holds": over_cap >= TARGET_OVER_CAP}
    if f:
        checks["long_fat_link_over_cap"] = {"value": f["one_host_large"]["over_cap"], "target": f">= {TARGET_OVER_CAP}",
                                            "holds": f["one_host_large"]["over_cap"] >= TARGET_OVER_CAP}  # fmt: skip
    if c:
        holds = c["corrupt_over_clean"] <= TARGET_CORRUPT_OVER_CLEAN and c["corrupt_host_dropped_every_run"]
        checks["corrupt_over_clean"] = {"value": c["corrupt_over_clean"],
                                        "target": f"<= {TARGET_CORRUPT_OVER_CLEAN}, corrupt host dropped",
                                        "holds": holds}  # fmt: skip
    return checks


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, times) = plt.subplots(1, 2, figsize=(13, 4.5))
    bars = {}
    for scenario, prefix in (("quarters", "20 Mbit/s joiner"), ("long_fat", "100 Mbit/s, 80 ms")):
        for name, figures in result.get(scenario, {}).items():
            if isinstance(figures, dict) and "over_cap" in figures:
                bars[f"{prefix}\n{name.replace('_', ' ')}"] = (figures["over_cap"], figures["transfer_over_cap"])
    labels = list(bars)
    rates.bar([i - 0.2 for i in range(len(labels))], [v[0] for v in bars.values()], 0.4, label="whole download")
    rates.bar([i + 0.2 for i in range(len(labels))], [v[1] for v in bars.values()], 0.4, label="transfer")
    rates.axhline(TARGET_OVER_CAP, color="r", linestyle="--", label=f"target {TARGET_OVER_CAP}")
    rates.set(title="download rate / the joiner's link cap", xticks=range(len(labels)), ylim=(0, 1.05))
    rates.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    rates.legend(fontsize=8)
    if "corrupt" in result:
        runs = result["corrupt"]["runs"]
        for i, rs in enumerate(runs.values()):
            times.scatter([i] * len(rs), [r["seconds"] for r in rs])
        times.set(title="4 hosts, one of them lying: download seconds", xticks=range(len(runs)), ylabel="seconds")
        times.set_xticklabels([f"{k}\n{result['corrupt']['median_seconds'][k]:.1f} s" for k in runs])
    fig.tight_layout()
    write_picture(path, fig, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--downlink", type=float, default=20.0,
                        help="the joiner's downlink, Mbit/s (quarters, corrupt)")
    parser.add_argument("--home-rtt-ms", type=float, default=100.0, help="round trip joiner-hosts (quarters, corrupt)")
    parser.add_argument("--fat-mbit", type=float, default=100.0, help="link of the long-fat scenario, Mbit/s")
    parser.add_argument("--fat-rtt-ms", type=float, default=80.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="the large payload lasts this long at the cap")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--congestion", default="cubic",
                        help="TCP congestion control in every namespace: what home and desktop systems run by default")
    parser.add_argument("--compare-congestion", nargs="*", default=["bbr"],
                        help="long_fat also measures the large payload with each of these (none: --compare-congestion)")
    parser.add_argument("--out", default="benchmarks/results/transfer")
    parser.add_argument("--from-json", default=None, help="only plot and print an earlier transfer.json")
    args = parser.parse_args()
    if args.from_json:
        finish(json.loads(Path(args.from_json).read_text()), Path(args.out))
        return
    if reason := netlab.available(delays=True):
        print(f"transfer.py: error: {reason}", file=sys.stderr)
        sys.exit(2)
    setup_logging()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every DHT, remove the lab
    MPFuture()  # hivemind's shared-memory manager, started outside any namespace the lab tears down
    sizes = {"default": max_checkpoint_bytes(ModelConfig()) / 1e6}
    began, result = time.monotonic(), {"config": vars(args), "default_checkpoint_mb": sizes["default"]}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for scenario in args.scenarios:
                result[scenario] = SCENARIOS[scenario](args, Path(tmp) / scenario, sizes)
    except SwarmError as error:
        print(f"transfer.py: error: {error}", file=sys.stderr)
        sys.exit(1)
    result["targets"], result["wall_seconds"] = targets(result), time.monotonic() - began
    finish(result, Path(args.out))


def finish(result: dict, out: Path) -> None:
    """transfer.json, the PNG, and the figures without the single runs on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "transfer.json", json.dumps(result, indent=2).encode())
    plot(result, out / "transfer.png")
    print(json.dumps(_without_runs(result), indent=2))


def _without_runs(value):
    if isinstance(value, dict):
        return {k: _without_runs(v) for k, v in value.items() if k != "runs"}
    return value


if __name__ == "__main__":
    main()
