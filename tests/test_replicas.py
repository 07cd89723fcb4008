"""How a generation client pings the replicas it chooses among (swarm/serving/replicas.py)."""

from __future__ import annotations

import asyncio
import math
import time

from swarm.p2p.directory import Host
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import BlockAnnouncement
from swarm.serving.replicas import MAX_BAN_S, Replicas

SILENT_KEYS = 4


def test_hosts_not_yet_pinged_are_pinged_all_at_once_and_the_silent_ones_banned():
    """Issue 57: a client pinged the candidates of a block one after another, so k free keys whose
    records name peers that never answer cost k ping timeouts before the honest host was reached.
    Now every host not yet pinged is pinged at once: each ping here waits until all k have started,
    which never happens one at a time (the call then times out), and none answers."""
    loop = EventLoopThread("test-replicas")
    replicas = Replicas(None, None, loop, None, None, None, ping_timeout=2.0)
    started = asyncio.Event()
    in_flight = []

    async def silent(peer_id: str):
        in_flight.append(peer_id)
        if len(in_flight) == SILENT_KEYS:
            started.set()
        await asyncio.wait_for(started.wait(), replicas.ping_timeout)  # raises if the pings run in turn
        return math.inf, None

    replicas._reach = silent
    hosts = [Host(0, BlockAnnouncement(peer_id=f"key{i}", state="serving", step=1), math.inf, owner=b"k%d" % i)
             for i in range(SILENT_KEYS)]  # fmt: skip
    try:
        assert replicas.round_trips(hosts) == [math.inf] * SILENT_KEYS
        assert sorted(in_flight) == sorted(h.peer_id for h in hosts)
        assert all(replicas.banned(h.peer_id) for h in hosts)
        assert replicas.unreachable == {(h.peer_id, h.owner) for h in hosts}
    finally:
        loop.close()


def test_a_host_that_keeps_failing_is_banned_twice_as_long_each_time_and_a_lie_for_good():
    """Issue 57: a key that answers pings fast and lets every request time out was banned 60 s and
    chosen again, costing a request its deadline every minute. Each ban for a while now doubles the
    last, up to `MAX_BAN_S`; a failure after a proven lie does not end the lie's ban."""
    replicas = Replicas(None, None, None, None, None, None, ban_seconds=60.0)
    stalling = Host(0, BlockAnnouncement(peer_id="stalling", state="serving", step=1), 0.01, owner=b"s")
    lengths = []
    for _ in range(8):
        before = time.monotonic()
        replicas.ban(stalling, "failed (timeout)")
        lengths.append(replicas.banned_until["stalling"] - before)
    assert [round(length) for length in lengths] == [60, 120, 240, 480, 960, 1920, MAX_BAN_S, MAX_BAN_S]
    liar = Host(0, BlockAnnouncement(peer_id="liar", state="serving", step=1), 0.01, owner=b"l")
    replicas.ban(liar, "contradicted by the answer computed here", math.inf)
    replicas.ban(liar, "failed (timeout)")
    assert replicas.banned_until["liar"] == math.inf
