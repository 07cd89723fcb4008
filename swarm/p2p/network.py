"""Joining the hivemind DHT, and running P2P calls from synchronous code.

hivemind does all the networking (DHT, libp2p daemon, NAT relays); this module only turns
user options into a started `DHT` with our record validators, within a bounded time, and
gives the calling process an event loop thread for its P2P handlers and calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psutil
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.p2p import P2P
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from swarm.errors import SwarmError
from swarm.files import write_atomic
from swarm.p2p.records import SwarmRecordValidator, check_swarm_name
from swarm.waiting import WaitStopped

logger = logging.getLogger(__name__)

DHT_START_TIMEOUT_S = 30.0
JOIN_RETRY_S = 2.0  # between starts of a daemon that reached none of the initial peers (`start_dht`)
UNREACHED_INITIAL_PEERS = "failed to connect to bootstrap peers"  # how the libp2p daemon says so
DHT_CALL_TIMEOUT_S = 20.0
# A DHT record lives on the nodes nearest its key, this many of them: every store (each peer's
# entry is its own store under its own subkey) goes to the RECORD_COPIES nearest nodes its
# writer finds, and readers (directory.py) ask exactly those (hivemind's default, made ours).
RECORD_COPIES = 5
CHILD_STOP_TIMEOUT_S = 10.0
STOP_POLL_S = 0.2  # how often a call told of a stop event looks at it (EventLoopThread.run)


def parse_maddrs(values: Sequence[str], option: str, need_peer_id: bool = False) -> list[str]:
    """Check multiaddrs given by the user; SwarmError naming the option for a malformed one."""
    parsed = []
    for value in values:
        try:
            maddr = Multiaddr(value)
        except Exception:  # multiaddr raises several types on bad text
            raise SwarmError(f"{option}: {value!r} is not a multiaddr "
                             "(e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3Koo...)") from None
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
    relayed: bool = False  # behind NAT: DHT client mode, reachable through the initial peers' relays (reachability.py)
    start_timeout: float = DHT_START_TIMEOUT_S
    dht_timeout: float = DHT_CALL_TIMEOUT_S  # seconds one DHT get or store may take

    def checked(self) -> NetworkOptions:
        self.initial_peers = parse_maddrs(self.initial_peers, "--initial-peers", need_peer_id=True)
        self.host_maddrs = parse_maddrs(self.host_maddrs, "--host-maddrs")
        self.announce_maddrs = parse_maddrs(self.announce_maddrs, "--announce-maddrs")
        return self


def load_or_create_key(path: str | Path) -> RSAPrivateKey:
    """The RSA key in `path` (DER), created on first use: the key a swarm's creator signs its
    model record with, or a peer its records, so that it stays the same across restarts."""
    path = Path(path)
    if not path.exists():
        write_atomic(path, RSAPrivateKey().to_bytes(), mode=0o600)
        logger.info("created a new RSA key in %s", path)
    return load_key(path)


def load_key(path: str | Path) -> RSAPrivateKey:
    """The RSA key in `path` (DER, as `load_or_create_key` writes it); SwarmError if there is none."""
    path = Path(path)
    try:
        der = path.read_bytes()
        loaded = serialization.load_der_private_key(der, password=None)
    except OSError as error:
        raise SwarmError(f"cannot read the key {path}: {error.strerror or error}") from None
    except (ValueError, TypeError, UnsupportedAlgorithm):  # garbage, encrypted, not a key
        raise SwarmError(f"{path} does not hold an RSA private key (DER, as this program writes them)") from None
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise SwarmError(f"{path} does not hold an RSA private key")
    key = RSAPrivateKey.__new__(RSAPrivateKey)  # hivemind's class has no loader; its unpickling hook is one
    key.__setstate__({"_private_key": der})
    return key


def ensure_identity(path: str) -> None:
    """Create a libp2p identity file on first use, so the peer id stays the same across restarts."""
    if not Path(path).exists():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(path)
        logger.info("created a new identity in %s", path)


def start_dht(swarm: str, options: NetworkOptions, private_key: RSAPrivateKey | None = None) -> DHT:
    """A running DHT node with BlockSwarm's validators, or SwarmError within `start_timeout`.

    A daemon that reaches none of the initial peers fails at once; it is started anew every
    JOIN_RETRY_S until `start_timeout` is spent, so that a bootstrap node still starting, or one
    connection lost on its way through a NAT, costs a few seconds instead of the peer's life."""
    check_swarm_name(swarm)
    options.checked()
    if options.identity_path:
        ensure_identity(options.identity_path)
    deadline = time.monotonic() + options.start_timeout
    while True:
        dht = _new_dht(options, private_key, swarm)
        try:
            with daemon_flags():
                dht.run_in_background(await_ready=True, timeout=max(1.0, deadline - time.monotonic()))
            return dht
        except Exception as error:  # whatever the daemon or its start raised: stop it, then try again or give up
            _stop(dht)
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            if UNREACHED_INITIAL_PEERS not in reason or time.monotonic() + JOIN_RETRY_S >= deadline:
                initial = options.initial_peers or "none"
                raise SwarmError(f"could not join the DHT (initial peers {initial}): {reason}") from None
            logger.warning("reached none of the initial peers (%s); trying again in %.0f s", reason, JOIN_RETRY_S)
            time.sleep(JOIN_RETRY_S)


def _new_dht(options: NetworkOptions, private_key: RSAPrivateKey | None, swarm: str) -> DHT:
    """A DHT node, not started, with BlockSwarm's validators and the options' relays."""
    validators = [RSASignatureValidator(private_key), SwarmRecordValidator(swarm)]
    relays = {"client_mode": options.client_mode, "use_relay": options.use_relay,
              "use_auto_relay": options.use_auto_relay}
    if options.relayed:  # behind NAT: the initial peers as its relays (reachability.py)
        relays.update(client_mode=True, use_auto_relay=True, trusted_relays=options.initial_peers,
                      force_reachability="private")
    return DHT(
        initial_peers=options.initial_peers or None,
        start=False,
        record_validators=validators,
        host_maddrs=options.host_maddrs,
        announce_maddrs=options.announce_maddrs or None,
        identity_path=options.identity_path,
        startup_timeout=options.start_timeout,
        num_replicas=RECORD_COPIES,
        **relays,
    )


@contextlib.contextmanager
def daemon_flags() -> Iterator[None]:
    """Give the libp2p daemons started inside the block (the DHT's: forked with the patch in
    place) two p2pd flags that hivemind 1.1.12's `P2P.create` does not expose:
    - relayService=0: p2pd otherwise runs two relay services, its own (4 GiB, 30 min per
      circuit) once AutoNAT finds the node public, and go-libp2p's default one (128 KiB each
      way, 2 min per circuit) from the start; whichever starts later takes over the protocol
      and forgets the other's reservations (NO_RESERVATION). With it, one relay with
      go-libp2p's limits: enough to set up a direct connection (reachability.py), never a
      free pipe for strangers' bulk;
    - relayDiscovery=0, for a daemon given trusted relays (behind NAT): p2pd then takes them as
      static relays and reserves a slot at once, where autorelay's discovery waits 3 minutes
      for 4 candidates (p2pd refuses autorelay with neither, so the others keep the default)."""
    with _DAEMON_FLAGS_LOCK:  # a class attribute patched by two threads at once would stay patched
        make_args = P2P._make_process_args

        def with_flags(*args, **kwargs) -> list[str]:
            flags = {"relayService": False, **({"relayDiscovery": False} if "trustedRelays" in kwargs else {})}
            return make_args(*args, **kwargs, **flags)

        P2P._make_process_args = staticmethod(with_flags)
        try:
            yield
        finally:
            P2P._make_process_args = staticmethod(make_args)


_DAEMON_FLAGS_LOCK = threading.Lock()


def _stop(dht: DHT) -> None:
    if dht.is_alive():
        dht.terminate()
        dht.join(timeout=5)


def stop_child(process: BaseProcess, graceful: Callable[[], None], timeout: float = CHILD_STOP_TIMEOUT_S) -> None:
    """Stop a child process of ours (the DHT, hivemind's averager) within `timeout` seconds,
    whatever state it is in: its own graceful shutdown first, then SIGKILL for it and every
    process it started (the DHT's libp2p daemon), so that nothing is left to hang the exit."""
    if process.pid is None:
        return
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        graceful()
    except Exception as error:  # stopping must not fail: what is left is killed below
        logger.debug("graceful shutdown of %s: %s", process.name, error)
    process.join(timeout)
    if process.is_alive():
        logger.warning("%s (pid %d) did not stop in %.0fs: killing it", process.name, process.pid, timeout)
        process.kill()
        process.join(1.0)
    for leftover in descendants:
        try:
            leftover.kill()  # psutil checks that the pid still belongs to the process it listed
        except psutil.Error:
            pass  # gone already, as it should be


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

    def run(self, coro: Awaitable[Any], timeout: float, stop: threading.Event | None = None) -> Any:
        """Run a coroutine on the loop and wait for it; TimeoutError (and a cancel) past `timeout`.
        With `stop`, WaitStopped (and a cancel) soon after it is set: a peer told to stop while it
        downloads its start checkpoint leaves without waiting for the download's end."""
        future = self.submit(asyncio.wait_for(coro, timeout))
        if stop is None:
            return future.result(timeout + 1.0)
        deadline = time.monotonic() + timeout + 1.0
        while not future.done() and time.monotonic() < deadline:
            if stop.wait(min(STOP_POLL_S, max(0.0, deadline - time.monotonic()))):
                future.cancel()
                raise WaitStopped("stopped while waiting for a call on the event loop")
        return future.result(0)  # TimeoutError if the deadline came first

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
