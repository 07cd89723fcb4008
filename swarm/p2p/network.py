"""Joining the hivemind DHT, and running P2P calls from synchronous code.

hivemind does all the networking (DHT, libp2p daemon, NAT relays); this module only turns
user options into a started `DHT` with our record validators, within a bounded time, and
gives the calling process an event loop thread for its P2P handlers and calls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Sequence

from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.p2p import P2P
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from swarm.errors import SwarmError
from swarm.p2p.records import SwarmRecordValidator, check_swarm_name

logger = logging.getLogger(__name__)

DHT_START_TIMEOUT_S = 30.0


def parse_maddrs(values: Sequence[str], option: str, need_peer_id: bool = False) -> list[str]:
    """Check multiaddrs given by the user; SwarmError naming the option for a malformed one."""
    parsed = []
    for value in values:
        try:
            maddr = Multiaddr(value)
        except Exception:  # multiaddr raises several types on bad text
            raise SwarmError(f"{option}: {value!r} is not a multiaddr (e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3Koo...)") from None
        if need_peer_id and "/p2p/" not in str(maddr):
            raise SwarmError(f"{option}: {value!r} has no /p2p/<peer id> part")
        parsed.append(str(maddr))
    return parsed


@dataclass
class NetworkOptions:
    """How this process joins the DHT; the defaults listen on 127.0.0.1 only."""

    initial_peers: list[str] = field(default_factory=list)
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"])
    announce_maddrs: list[str] = field(default_factory=list)
    identity_path: str | None = None
    client_mode: bool = False  # for a peer behind NAT: makes requests, serves none over the DHT
    use_relay: bool = True
    use_auto_relay: bool = False  # look for relays to become reachable behind NAT
    start_timeout: float = DHT_START_TIMEOUT_S

    def checked(self) -> "NetworkOptions":
        self.initial_peers = parse_maddrs(self.initial_peers, "--initial-peers", need_peer_id=True)
        self.host_maddrs = parse_maddrs(self.host_maddrs, "--host-maddrs")
        self.announce_maddrs = parse_maddrs(self.announce_maddrs, "--announce-maddrs")
        return self


def ensure_identity(path: str) -> None:
    """Create a libp2p identity file on first use, so the peer id stays the same across restarts."""
    if not Path(path).exists():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(path)
        logger.info("created a new identity in %s", path)


def start_dht(swarm: str, options: NetworkOptions, private_key: RSAPrivateKey | None = None) -> DHT:
    """A running DHT node with BlockSwarm's validators, or SwarmError within `start_timeout`."""
    check_swarm_name(swarm)
    options.checked()
    if options.identity_path:
        ensure_identity(options.identity_path)
    validators = [RSASignatureValidator(private_key), SwarmRecordValidator(swarm)]
    dht = DHT(
        initial_peers=options.initial_peers or None,
        start=False,
        record_validators=validators,
        host_maddrs=options.host_maddrs,
        announce_maddrs=options.announce_maddrs or None,
        identity_path=options.identity_path,
        client_mode=options.client_mode,
        use_relay=options.use_relay,
        use_auto_relay=options.use_auto_relay,
        startup_timeout=options.start_timeout,
    )
    try:
        dht.run_in_background(await_ready=True, timeout=options.start_timeout)
    except Exception as error:
        _stop(dht)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SwarmError(f"could not join the DHT (initial peers {options.initial_peers or 'none'}): {reason}") from None
    return dht


def _stop(dht: DHT) -> None:
    if dht.is_alive():
        dht.terminate()
        dht.join(timeout=5)


def visible_maddrs(dht: DHT) -> list[str]:
    return [str(m) for m in dht.get_visible_maddrs()]


class EventLoopThread:
    """An asyncio loop in a daemon thread: P2P handlers live here, and sync code submits calls."""

    def __init__(self, name: str = "p2p-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[Any], timeout: float) -> Any:
        """Run a coroutine on the loop and wait for it; TimeoutError (and a cancel) past `timeout`."""
        future = self.submit(asyncio.wait_for(coro, timeout))
        return future.result(timeout + 1.0)

    def close(self, *p2ps: P2P | None) -> None:
        """Shut down this process's P2P handles on the loop, then stop the loop."""
        for p2p in p2ps:
            try:
                if p2p is not None:
                    self.run(p2p.shutdown(), timeout=5)
            except Exception as error:  # closing must not hang or fail
                logger.debug("P2P shutdown: %s", error)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
