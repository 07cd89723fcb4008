"""How a generation client pings the replicas it chooses among (swarm/serving/replicas.py)."""

from __future__ import annotations

import asyncio
import math

from swarm.p2p.directory import Host
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import BlockAnnouncement
from swarm.serving.replicas import Replicas

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
