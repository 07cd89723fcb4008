"""A process that joins a swarm to ask it things: the commands, the benchmarks and the tests.

`SwarmClient` is a DHT node in client mode (it asks, it does not store others' records), the
swarm's directory on it, and an event loop thread with a P2P handle for calls to peers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Awaitable

from swarm.errors import SwarmError
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht, stop_child

P2P_START_TIMEOUT_S = 30.0


class SwarmClient:
    """Joins swarm `swarm` as a client on entering, leaves it on exit (a context manager)."""

    def __init__(self, swarm: str, network: NetworkOptions, creator: str | None = None):
        self.swarm, self.creator = swarm, creator
        self.network = dataclasses.replace(network, client_mode=True)

    def __enter__(self) -> "SwarmClient":
        self.dht = start_dht(self.swarm, self.network)
        try:
            self.directory = SwarmDirectory(self.dht, self.swarm, creator=self.creator, call_timeout=self.network.dht_timeout)
            self.loop = EventLoopThread()
            self.p2p = self.loop.run(self.dht.replicate_p2p(), P2P_START_TIMEOUT_S)
        except BaseException:
            stop_child(self.dht, self.dht.shutdown)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.loop.close(self.p2p)
        stop_child(self.dht, self.dht.shutdown)

    def run(self, coro: Awaitable[Any], timeout: float) -> Any:
        """Run a P2P coroutine on the client's loop and wait for it; SwarmError past `timeout`."""
        try:
            return self.loop.run(coro, timeout)
        except TimeoutError:
            raise SwarmError(f"a call to the swarm did not finish within {timeout:.0f}s") from None
