"""Discovery at scale: many DHT nodes announcing blocks as peers do, and lookups counted in round trips.

`AnnouncingSwarm` runs N real hivemind DHT nodes of one swarm without N peers: each node is
a `hivemind.DHT` started by `start_dht` (our validators, its own child process and libp2p
daemon) with its own RSA key, and writes a signed `BlockAnnouncement` through
`SwarmDirectory.announce` when it joins and then every announce period, as a peer's announcer
thread does. One Python process drives them all; a node costs its DHT process (about 25 MB
here) and its daemon (about 65 MB), so 64 of them fit a small machine, where 64 whole peers
(each with torch and a model) would not. Given a `NetLab`, a node lives in its region's
namespace (several nodes share one emulated host), so its traffic crosses the lab's router.

`trace_lookups` makes a DHT process record every find RPC that each of its `get` calls
makes, so a lookup made the usual way (`SwarmDirectory.hosts`) can be measured, not
estimated: `last_lookup` returns its calls; `LookupTrace.round_trips` counts the calls the
lookup waited for one after the other (its RPCs run several at a time, so their number is
not its latency), and `round_trips_to_value` the hops to the first node holding the record.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

from hivemind import DHT
from hivemind.dht.node import DHTNode
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.mpfuture import MPFuture

from swarm.lab.netlab import NetLab, Node
from swarm.p2p.client import SwarmClient
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.network import NetworkOptions, start_dht, stop_child, visible_maddrs
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo

logger = logging.getLogger(__name__)

TRACE_TIMEOUT_S = 10.0  # to install the tracer in a DHT process, or fetch a trace from it
LIFETIME_PERIODS = 3  # a record lives this many announce periods, as a peer's does


@dataclass
class FindCall:
    """One find RPC of a lookup, in seconds since the lookup began; `ended` is None if the
    lookup returned (or was cancelled) before it finished."""

    started: float
    ended: float | None = None
    answered: bool = False  # False: the peer did not answer in time, or failed
    found_value: bool = False  # the answer carried the record (some of its entries)


@dataclass
class LookupTrace:
    """The find RPCs one DHT `get` made, and when it returned (seconds since it began).

    Round trips are counted along a chain of calls: from a call, one step back goes to the call
    whose answer came last before it was sent (what set its worker free, or gave it its target).
    Calls in flight side by side count once; calls that follow one another all count."""

    seconds: float
    calls: list[FindCall] = field(default_factory=list)

    @property
    def rpcs(self) -> int:
        return len(self.calls)

    @property
    def round_trips(self) -> int:
        """Round trips the lookup waited for, one after the other: the chain that ends with the
        last call answered before it returned (0 if it made none)."""
        done = [c for c in self.calls if c.ended is not None and c.ended <= self.seconds]
        return self._chain(max(done, key=lambda c: c.ended)) if done else 0

    @property
    def round_trips_to_value(self) -> int | None:
        """Round trips until the first answer that carried the record: the Kademlia hops to a node
        that stores it (None if no answer did). A `get` with latest=True goes on searching after it."""
        found = [c for c in self.calls if c.found_value and c.ended is not None]
        return self._chain(min(found, key=lambda c: c.ended)) if found else None

    def _chain(self, last: FindCall) -> int:
        length, call = 1, last
        while before := [c for c in self.calls if c is not call and c.ended is not None and c.ended <= call.started]:
            call, length = max(before, key=lambda c: c.ended), length + 1
        return length


# Inside a DHT process: the calls of the `get` running in the current asyncio context, and the
# last trace of each key. Every DHT process has its own copy (it is forked before any is made).
_CALLS: contextvars.ContextVar[list[FindCall] | None] = contextvars.ContextVar("lookup_calls", default=None)
_TRACES: dict[str, LookupTrace] = {}


async def _install_tracer(dht: DHT, node: DHTNode) -> None:
    """(Runs in the DHT process.) Wrap the node's find RPC, and the DHT's handler of `get`
    requests, so that every get records the find calls made on its behalf: the tasks of its
    search inherit its context, background work (cache refresh, announcements) does not."""
    find, get = node.protocol.call_find, dht._get

    async def traced_find(peer, keys):
        calls = _CALLS.get()
        if calls is None:
            return await find(peer, keys)
        call = FindCall(started=time.monotonic())
        calls.append(call)
        response = await find(peer, keys)
        call.ended, call.answered = time.monotonic(), response is not None
        call.found_value = any(value is not None for value, _ in (response or {}).values())
        return response

    async def traced_get(key, latest, future, **kwargs):
        calls: list[FindCall] = []
        token = _CALLS.set(calls)
        began = time.monotonic()
        try:
            await get(key, latest, future, **kwargs)
        finally:
            _CALLS.reset(token)
            for call in calls:  # to seconds since the lookup began
                call.started -= began
                call.ended = None if call.ended is None else call.ended - began
            _TRACES[key] = LookupTrace(time.monotonic() - began, calls)

    node.protocol.call_find = traced_find
    dht._get = traced_get  # the DHT process looks its handlers up on the instance


async def _pop_trace(dht: DHT, node: DHTNode, key: str) -> LookupTrace | None:
    return _TRACES.pop(key, None)


def trace_lookups(dht: DHT) -> None:
    """From now on, the DHT process of `dht` keeps the find calls of each `get` (see `last_lookup`)."""
    dht.run_coroutine(_install_tracer, return_future=True).result(TRACE_TIMEOUT_S)


def last_lookup(dht: DHT, key: str) -> LookupTrace | None:
    """The trace of the last `get` of `key` on `dht` since the last call (None if there was none)."""
    return dht.run_coroutine(partial(_pop_trace, key=key), return_future=True).result(TRACE_TIMEOUT_S)


@dataclass
class AnnouncingNode:
    """One DHT node that hosts a block on paper: its own key, directory and announcement."""

    name: str
    region: str
    block: int
    dht: DHT
    directory: SwarmDirectory
    announcement: BlockAnnouncement
    next_announce: float = 0.0  # time.monotonic() of its next periodic announcement


def placeholder_announcement(dht: DHT, name: str, step: int = 0) -> BlockAnnouncement:
    """A serving peer's announcement, of the size a real one has (with a checkpoint)."""
    checkpoint = CheckpointInfo(step=step, sha256="0" * 64, size=1 << 20, chunks="0" * 64)
    return BlockAnnouncement(peer_id=str(dht.peer_id), state="serving", step=step, checkpoint=checkpoint,
                             loss=1.0, throughput=1.0, version="lab", public_name=name)  # fmt: skip


@dataclass
class AnnouncingSwarm:
    """DHT nodes of swarm `swarm`, each announcing one of `n_blocks` blocks every `announce_period`
    seconds; nodes run on 127.0.0.1, or in the namespace of `lab`'s node named after their region
    (nodes of one region share it, so traffic between them skips the router and its delays).
    A context manager: every DHT process it started is stopped on exit."""

    swarm: str
    n_blocks: int
    announce_period: float = 10.0
    lab: NetLab | None = None
    nodes: list[AnnouncingNode] = field(default_factory=list)
    initial_peers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # hivemind's futures keep their state in shared memory through torch's manager process, which
        # the first future starts: start it here, not inside a lab namespace where the lab's teardown
        # would kill it while this process still frees memory through it (and aborts on the broken pipe)
        MPFuture()
        self._lock = threading.Lock()  # one announcement at a time: a DHT's pipe is not thread-safe
        self._stopping = threading.Event()
        self._announcer: threading.Thread | None = None

    def __enter__(self) -> AnnouncingSwarm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def network(self, region: str) -> NetworkOptions:
        """How a node in `region` joins: through the first node, listening on its host's address."""
        host = "127.0.0.1" if self.lab is None else self._host(region).address
        return NetworkOptions(initial_peers=list(self.initial_peers), host_maddrs=[f"/ip4/{host}/tcp/0"])

    def _host(self, region: str) -> Node:
        return self.lab.nodes[region]

    def placed(self, region: str) -> contextlib.AbstractContextManager:
        """Where processes forked in this block live: `region`'s lab namespace, or right here."""
        return contextlib.nullcontext() if self.lab is None else self._host(region).inside()

    def add_node(self, region: str, block: int) -> AnnouncingNode:
        """Start one node in `region` and announce its block as a joining peer does (waiting for the store)."""
        key = RSAPrivateKey()
        with self.placed(region):
            dht = start_dht(self.swarm, self.network(region), private_key=key)
        name = f"n{len(self.nodes)}"
        node = AnnouncingNode(name, region, block, dht, SwarmDirectory(dht, self.swarm, private_key=key),
                              placeholder_announcement(dht, name))  # fmt: skip
        self.nodes.append(node)
        if not self.initial_peers:
            self.initial_peers = visible_maddrs(dht)
        self.announce(node, wait=True)
        return node

    def announce(self, node: AnnouncingNode, step: int | None = None, wait: bool = False) -> float:
        """Store `node`'s announcement now (with a new `step` if given) and return the time.monotonic()
        at which the store was sent; its next periodic announcement is one period later."""
        with self._lock:
            if step is not None:
                node.announcement = placeholder_announcement(node.dht, node.name, step)
            sent = time.monotonic()
            node.directory.announce(node.block, node.announcement, LIFETIME_PERIODS * self.announce_period, wait=wait)
            node.next_announce = sent + self.announce_period
        return sent

    def start_announcing(self) -> None:
        """Every node announces once per period from now on (in a thread), like a peer's announcer."""
        if self._announcer is None:
            self._announcer = threading.Thread(target=self._announce_periodically, name="announcer", daemon=True)
            self._announcer.start()

    def _announce_periodically(self) -> None:
        while not self._stopping.wait(0.05):
            for node in list(self.nodes):
                if time.monotonic() >= node.next_announce and not self._stopping.is_set():
                    try:
                        self.announce(node)
                    except Exception as error:  # a lapse is what a real peer would risk too: log it, go on
                        logger.warning("%s could not announce: %s", node.name, error)

    @contextlib.contextmanager
    def client(self, region: str) -> Iterator[SwarmClient]:
        """A fresh `SwarmClient` (a client-mode DHT node, as swarm-fetch starts) in `region`,
        with its lookups traced (see `last_lookup`)."""
        with contextlib.ExitStack() as stack:
            with self.placed(region):
                client = stack.enter_context(SwarmClient(self.swarm, self.network(region)))
            trace_lookups(client.dht)
            yield client

    def close(self) -> None:
        self._stopping.set()
        if self._announcer is not None:
            self._announcer.join(timeout=10)
        for node in self.nodes:
            stop_child(node.dht, node.dht.shutdown)
        self.nodes.clear()


def spread(count: int, regions: Sequence[str], n_blocks: int) -> list[tuple[str, int]]:
    """(region, block) of nodes 0..count-1: blocks in turn, so every block gets hosts as the swarm
    grows (as `--block auto` picks the least hosted); regions in turn, shifted by one for each
    round of blocks, so that the hosts of one block are spread over the regions."""
    return [(regions[(i + i // n_blocks) % len(regions)], i % n_blocks) for i in range(count)]
