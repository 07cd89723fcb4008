"""Linux network namespaces for benchmarks and tests: each process on its own emulated machine, one router.

`NetLab` builds a star: a router namespace and, per node, a namespace joined to the router
by a veth pair on its own /24 (node .2, router .1). Everything the lab makes is named with
its prefix, so teardown removes exactly that (and a lab left behind by a killed run is
removed when the next one with the same prefix starts). Traffic never leaves the lab's
namespaces: the root namespace gets no address or route into them.

Each node's `eth0` counters are the operating system's count of what that node sent and
received, which the sync benchmark checks its own byte counts against.

Emulated regions: every node belongs to a region; `cap()` limits a node's upload and
download with `tbf` qdiscs, and `start_delays()` delays every packet the router forwards by
the one-way delay between the two nodes' regions, with an NFQUEUE rule and the
`swarm.lab.delayd` daemon (`tc netem` is missing on some kernels; where present it would do).
`set_congestion()` picks the nodes' TCP congestion control (else the kernel's default).

Behind NAT: `add_nat(region)` makes a home router for a region, a node on the lab's router
(its one public address) that masquerades what its home nodes send and forwards nothing
inbound that they did not start (`symmetric=True`: a new random port per connection, as a
symmetric NAT does); `add_node(..., behind=nat)` puts a node on that router's home network
(192.168.<j>.2, router .1), which the lab's router has no route to. A lab with NAT needs its
"internet" on public-looking addresses (`NetLab(subnet=PUBLIC_SUBNET)`): libp2p drops
private (RFC 1918) relay addresses when it builds circuit addresses, so a relay on 10.x
gives a NATed peer none (checked: 11.x works, 10.x does not). The range is never routed
outside: the root namespace has no address or route into the lab.

Needs root and `ip` (iproute2); delays and NAT also need `iptables`, delays the
NetfilterQueue package. `available()` says why not where something is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

from swarm.errors import SwarmError

logger = logging.getLogger(__name__)

SUBNET = "10.231"  # nodes get 10.231.<i>.2, the router 10.231.<i>.1
PUBLIC_SUBNET = "11.231"  # public-looking, for labs with NAT (see above); used only inside the lab
HOME_SUBNET = "192.168"  # a node behind NAT gets 192.168.<j>.2, its home router 192.168.<j>.1
CLONE_NEWNET = 0x40000000  # setns(2): the fd names a network namespace


def available(delays: bool = False, nat: bool = False) -> str | None:
    """None if namespaces (and, with `delays`, emulated delays; with `nat`, home routers) can be
    made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for command in ("ip", "tc") + (("iptables",) if delays or nat else ()):
        if not shutil.which(command):
            return f"emulated networks need the '{command}' command"
    if delays and importlib.util.find_spec("netfilterqueue") is None:
        return (
            "emulated delays need the NetfilterQueue package (pip install NetfilterQueue; needs libnetfilter-queue-dev)"
        )
    return None


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(args, check=False, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise SwarmError(f"{' '.join(args)}: {result.stderr.strip()}")
    return result


@dataclass
class Node:
    """One emulated machine: its namespace, its address, and the router's side of its link."""

    namespace: str
    address: str
    router_link: str  # the veth end inside the router namespace
    region: str = "local"
    gateway: str | None = None  # the namespace router_link is in: a home router's, or None for the lab's router

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]

    def counter(self, name: str) -> int:
        """An `eth0` statistic of this node (tx_bytes, rx_bytes, ...), read inside its namespace."""
        path = f"/sys/class/net/eth0/statistics/{name}"
        return int(sh(*self.exec_prefix(), "cat", path).stdout)

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Run the calling thread in this node's namespace until the block ends: a process it
        forks meanwhile (a hivemind DHT, and the libp2p daemon that DHT starts) lives there for
        good, while the rest of this process stays where it was. This puts many DHT nodes on one
        emulated host without a Python interpreter each under `ip netns exec`. Any other helper
        process started meanwhile lands there too, and dies with the lab: start those before.
        One is started here: hivemind's first shared tensor starts torch's shared-memory manager,
        a child this process keeps using, and it would abort when teardown kills it."""
        from hivemind.utils.mpfuture import SharedBytes  # imports torch: only callers that fork DHTs pay for it

        SharedBytes.next()
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{self.namespace}") as there:
            _setns(libc, there.fileno())
            try:
                yield
            finally:
                _setns(libc, home.fileno())


def _setns(libc: ctypes.CDLL, fd: int) -> None:
    if libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise SwarmError(f"setns: {os.strerror(error)}")


def load_regions(path: Path, nat: bool = False) -> tuple[dict, Callable[[str, str], float]]:
    """Regions from a YAML file like benchmarks/regions.yaml: (each region's link caps,
    one_way_s(region a, region b)), the delay a lab's router gives a packet between them.
    Regions marked `behind_nat` (a home router in front of their hosts) only with `nat`."""
    import yaml  # PyYAML comes with hivemind and the `bench` extra; only region files need it

    spec = yaml.safe_load(Path(path).read_text())
    regions = {name: caps for name, caps in spec["regions"].items() if nat or not caps.get("behind_nat")}
    delays = {}
    for a, row in spec["one_way_ms"].items():
        for b, ms in row.items():
            delays[a, b] = delays[b, a] = ms / 1000
    within = spec.get("within_region_ms", 0) / 1000
    return regions, lambda a, b: within if a == b else delays[a, b]


@dataclass
class NetLab:
    """Namespaces named `<prefix>-...`; use as a context manager so teardown always runs."""

    prefix: str = "bsw"
    subnet: str = SUBNET  # the "internet" side; PUBLIC_SUBNET where some region sits behind NAT
    nodes: dict[str, Node] = field(default_factory=dict)
    # TCP congestion control of every node; None: the kernel's default (see set_congestion)
    congestion: str | None = None

    @property
    def router(self) -> str:
        return f"{self.prefix}-router"

    def __enter__(self) -> Self:
        if reason := available():
            raise SwarmError(reason)
        self.teardown()  # whatever a killed run with this prefix left
        sh("ip", "netns", "add", self.router)
        self.router_exec("ip", "link", "set", "lo", "up")
        self.router_exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def router_exec(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.router, *args, check=check)

    def add_node(self, name: str, region: str = "local", behind: Node | None = None) -> Node:
        """A node on the lab's router, or on the home network of the NAT router `behind` (add_nat)."""
        index = len(self.nodes) + 1
        namespace, router_link = f"{self.prefix}-{name}", f"{self.prefix}{index}"
        gateway = behind.namespace if behind else self.router
        network = f"{HOME_SUBNET}.{self._homes(behind) + 1}" if behind else f"{self.subnet}.{index}"
        sh("ip", "netns", "add", namespace)
        sh("ip", "link", "add", router_link, "netns", gateway, "type", "veth",
           "peer", "name", "eth0", "netns", namespace)  # fmt: skip
        node = Node(namespace, f"{network}.2", router_link, region, behind.namespace if behind else None)
        for args in (["addr", "add", f"{network}.1/24", "dev", router_link], ["link", "set", router_link, "up"]):
            sh("ip", "netns", "exec", gateway, "ip", *args)
        for args in (
            ["link", "set", "lo", "up"],
            ["addr", "add", f"{node.address}/24", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            ["route", "add", "default", "via", f"{network}.1"],
        ):
            sh(*node.exec_prefix(), "ip", *args)
        if self.congestion:
            sh(*node.exec_prefix(), "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={self.congestion}")
        self.nodes[name] = node
        return node

    def set_congestion(self, algorithm: str) -> None:
        """Give every node, and every node added later, the TCP congestion control `algorithm`
        (for the sockets opened from now on). Why a lab chooses: a namespace takes the kernel's
        default, the machine's choice, not the one of the peers the lab stands for; home and
        desktop systems (Linux, Windows, macOS) default to cubic, while a host whose default is
        bbr (this project's CI machine) gives a single long flow a pause every 10 s (BBR's
        ProbeRTT: 200 ms at 4 packets in flight while a queue hides the path's round trip).
        A namespace may only pick an algorithm the kernel allows, so it is added to that
        global list (tcp_allowed_congestion_control) if missing; it stays there."""
        allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
        if algorithm not in allowed.read_text().split():
            if algorithm not in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split():
                raise SwarmError(f"this kernel has no TCP congestion control '{algorithm}' (modprobe tcp_{algorithm})")
            allowed.write_text(f"{allowed.read_text().strip()} {algorithm}")
        self.congestion = algorithm
        for node in self.nodes.values():
            sh(*node.exec_prefix(), "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={algorithm}")

    def _homes(self, nat: Node) -> int:
        return sum(node.gateway == nat.namespace for node in self.nodes.values())

    def add_nat(self, region: str, symmetric: bool = False) -> Node:
        """A home router for `region`, as a node on the lab's router (its public address): it
        masquerades what its home nodes send (`symmetric`: from a new random port for every
        connection) and drops every inbound connection they did not open. Nodes go behind it
        with `add_node(name, region, behind=<this>)`; it runs no program of ours."""
        if reason := available(nat=True):
            raise SwarmError(reason)
        if ipaddress.ip_address(f"{self.subnet}.0.1").is_private:
            raise SwarmError(
                f"a lab with NAT needs public-looking addresses: NetLab(subnet=PUBLIC_SUBNET), not {self.subnet}"
            )
        nat = self.add_node(f"nat-{region}", region)
        masquerade = ["--random-fully"] if symmetric else []
        for args in (["sysctl", "-qw", "net.ipv4.ip_forward=1"],
                     ["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE", *masquerade],
                     ["iptables", "-A", "FORWARD", "-i", "eth0", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                      "-j", "ACCEPT"],
                     ["iptables", "-A", "FORWARD", "-i", "eth0", "-j", "DROP"]):  # fmt: skip
            sh(*nat.exec_prefix(), *args)
        return nat

    def cap(self, node: Node, up_mbit: float | None, down_mbit: float | None) -> None:
        """Limit what `node` sends (its eth0) and receives (the router's link to it) with tbf."""
        for rate, where in (
            (up_mbit, node.exec_prefix()),
            (down_mbit, ["ip", "netns", "exec", node.gateway or self.router]),
        ):
            if rate:
                device = "eth0" if where == node.exec_prefix() else node.router_link
                burst = max(32_000, int(rate * 1e6 / 8 / 250))  # 4 ms of traffic, at least 32 kB
                sh(*where, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                   "rate", f"{rate}mbit", "burst", str(burst), "latency", "400ms")  # fmt: skip

    def cap_by_region(self, regions: dict, skip: Collection[Node] = ()) -> None:
        """Cap every node's links (`cap`) at its region's `up_mbit` and `down_mbit`, as `load_regions`
        reads them, except the nodes in `skip` (a home router only passes its hosts' capped traffic on)."""
        for node in self.nodes.values():
            if node not in skip:
                caps = regions[node.region]
                self.cap(node, caps.get("up_mbit"), caps.get("down_mbit"))

    def start_delays(self, one_way_s: Callable[[str, str], float], queue: int = 0) -> None:
        """Delay every forwarded packet by `one_way_s(from region, to region)`: the delay daemon
        first, then the rule that feeds it (with --queue-bypass: no daemon, no delay, no loss)."""
        if reason := available(delays=True):
            raise SwarmError(reason)
        on_router = [node for node in self.nodes.values() if node.gateway is None]  # a home router stands for its home
        delays = {
            f"{a.router_link}>{b.router_link}": one_way_s(a.region, b.region)
            for a in on_router for b in on_router if a is not b
        }  # fmt: skip
        daemon = subprocess.Popen(
            ["ip", "netns", "exec", self.router, sys.executable, "-m", "swarm.lab.delayd", "--queue", str(queue),
             "--delays", json.dumps(delays)], stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        if daemon.stdout.readline().strip() != "ready":
            daemon.kill()
            raise SwarmError("the delay daemon did not start (see its stderr above)")
        self.router_exec("iptables", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass")

    def namespaces(self) -> list[str]:
        listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
        return [line.split()[0] for line in listed if line.startswith(f"{self.prefix}-")]

    def pids(self) -> list[int]:
        """Every process that runs in one of the lab's namespaces."""
        return [
            int(pid)
            for namespace in self.namespaces()
            for pid in sh("ip", "netns", "pids", namespace, check=False).stdout.split()
        ]

    def teardown(self) -> None:
        """Kill every process in the lab's namespaces, then delete them (their links, addresses
        and iptables rules go with them)."""
        killed = self.pids()
        for pid in killed:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        _wait_gone(killed, TEARDOWN_WAIT_S)
        for namespace in self.namespaces():
            sh("ip", "netns", "delete", namespace, check=False)
        self.nodes.clear()


TEARDOWN_WAIT_S = 10.0  # killed processes, until the kernel has ended them


def alive(pid: int) -> bool:
    """Whether a process still runs. A zombie does not: it has ended and holds nothing but its
    process-table entry until its parent reaps it, and an orphan's parent is init, which in
    some containers (this project's CI among them) never reaps."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Wait until no process of `pids` runs any more (a killed one takes a moment to end)."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        logger.warning("processes %s of a torn-down lab still run %.0fs after SIGKILL", left, timeout)
