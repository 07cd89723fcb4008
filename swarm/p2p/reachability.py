"""Whether others can dial this peer, and how to reach a peer that sits behind NAT.

Everything here runs over hivemind's libp2p daemon; three parts:

1. Finding out (`probe`). Before it joins, a peer starts a throwaway daemon on its listen
   addresses, connects to the initial peers of the join line and asks each (`rpc_dial_back`)
   to open a TCP connection to the address it sees the request come from, on the peer's
   listening port, and to check that a libp2p listener answers there (the multistream header).
   The peer is reachable directly when most of the answers say so. Like AutoNAT, a helper
   dials only the address the request came from, so nobody can point it at a third party.
   (hivemind's daemon runs AutoNAT too, but does not tell its verdict to its client.)
2. Acting on it (`NetworkOptions.relayed`, see network.py). A peer nobody can dial runs its
   DHT in client mode and reserves a slot on the initial peers' circuit relays, taken as
   static relays: it has a /p2p-circuit address within a second, where autorelay's discovery
   waits 3 minutes for 4 candidates. A peer that gets none within `RELAY_TIMEOUT_S` says so in
   one line and announces nothing (`require_circuit`).
3. Reaching it (`ensure_direct`). A relay carries little: each relayed connection is reset
   after 128 KiB each way and 2 minutes (go-libp2p's default limits, kept: relays are other
   people's computers), and a stream cut that way just ends, with no error. So a caller that
   reaches a peer only through a relay asks it to dial back (`rpc_dial_me`, one small relayed
   call), closes the relayed connection, and waits for the peer's direct connection, which
   the downloads, denoise requests and sync polls that follow then use (connection reversal;
   libp2p's hole punching never upgraded a relayed connection in our runs). A peer behind NAT
   therefore serves callers that can be dialed; two peers both behind NAT cannot reach each
   other.

The answers to a probe come from the join line's peers; what a peer announces about itself
(`reached`) only orders choices: a caller measures the connection it gets (`route`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
from dataclasses import dataclass
from typing import Literal

from hivemind import DHT
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2
from hivemind.utils.multiaddr import Multiaddr

from swarm.errors import SwarmError
from swarm.p2p.limits import Busy, PerPeerLimit
from swarm.p2p.messages import DialBackReply, DialBackRequest, DialMeReply, DialMeRequest, MessageError, error_reply
from swarm.p2p.network import EventLoopThread, NetworkOptions
from swarm.waiting import WaitTimeout, wait_for

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0  # a throwaway daemon, its connection to the initial peers, their dial-backs
DIAL_BACK_TIMEOUT_S = 3.0  # one TCP connection back to a joining peer, and the listener's first bytes
MULTISTREAM = b"/multistream/1.0.0"  # what a libp2p listener sends first on every new connection
MAX_ASKED = 3  # initial peers asked to dial back
REVERSAL_TIMEOUT_S = 5.0  # a peer behind NAT dialing a caller back
RELAY_TIMEOUT_S = 30.0  # a peer behind NAT getting a circuit address from its relays
POLL_S = 0.05
Route = Literal["direct", "relayed", "none"]
REACHABILITY_CHOICES = ("auto", "direct", "relayed")  # what `plan` takes: probe, or say so


@dataclass(frozen=True)
class Reachability:
    """What the initial peers found: `direct` (None: nobody could tell) and their answers."""

    direct: bool | None
    answers: dict[str, str]

    def describe(self) -> str:
        return ", ".join(f"{peer[-8:]}: {status}" for peer, status in self.answers.items()) or "no answer"


class ReachabilityServicer(ServicerBase):
    """`rpc_dial_back` (answered on the public side only) and `rpc_dial_me` (connection reversal)."""

    def __init__(self, p2p: P2P, public: bool = True):
        self.p2p, self.public = p2p, public
        self.limit = PerPeerLimit(1)
        self._dialing: dict[PeerID, asyncio.Task] = {}  # held here: the loop keeps only weak references to tasks

    async def rpc_dial_back(self, request: runtime_pb2.ExpertRequest,
                            context: P2PContext) -> runtime_pb2.ExpertResponse:
        try:
            asked = DialBackRequest.decode(request.metadata)
            with self.limit.admit(context):
                reply = await self._dial_back(asked, context.remote_id)
        except (MessageError, Busy) as error:
            reply = DialBackReply(status="cannot tell", error=str(error)[:300])
        return runtime_pb2.ExpertResponse(metadata=reply.encode())

    async def _dial_back(self, asked: DialBackRequest, asker: PeerID) -> DialBackReply:
        if not self.public:
            return DialBackReply(status="cannot tell", error="this peer is behind NAT itself")
        seen = await _direct_addresses(self.p2p, asker)
        if not seen:
            return DialBackReply(status="cannot tell", error="no direct connection from you to dial back along")
        host = Multiaddr(seen[0])["ip4"]
        for port in asked.ports:
            if await _libp2p_listens(host, port):
                return DialBackReply(status="reachable", address=f"{host}:{port}")
        return DialBackReply(status="unreachable", address=f"{host}:{asked.ports[0]}")

    async def rpc_dial_me(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        try:
            DialMeRequest.decode(request.metadata)
        except MessageError as error:
            return error_reply(error)
        caller = context.remote_id
        if await _direct_addresses(self.p2p, caller):
            status = "direct"
        elif caller in self._dialing:
            status = "busy"
        else:
            status = "dialing"
            self._dialing[caller] = asyncio.create_task(self._reverse(caller))
        return runtime_pb2.ExpertResponse(metadata=DialMeReply(status=status).encode())

    async def _reverse(self, caller: PeerID) -> None:
        """Once the caller has closed the relayed connection, dial it: an outbound connection
        from behind NAT (libp2p would otherwise keep using the relayed one)."""
        try:
            async with asyncio.timeout(REVERSAL_TIMEOUT_S):
                while await _connected(self.p2p, caller):
                    await asyncio.sleep(POLL_S)
                await self.p2p._client.connect(caller, [])  # hivemind exposes no connect; its own code calls this
        except Exception as error:  # the caller gave up, or cannot be dialed either
            logger.info("could not dial %s back: %s", caller, error)
        finally:
            self._dialing.pop(caller, None)


async def _peer_addresses(p2p: P2P, peer: PeerID) -> list[str]:
    """The remote addresses of our open connections to `peer`."""
    return [str(a) for info in await p2p.list_peers() if info.peer_id == peer for a in info.addrs]


async def _connected(p2p: P2P, peer: PeerID) -> bool:
    return bool(await _peer_addresses(p2p, peer))


async def _direct_addresses(p2p: P2P, peer: PeerID) -> list[str]:
    return [a for a in await _peer_addresses(p2p, peer) if "/p2p-circuit" not in a and a.startswith("/ip4/")]


async def _libp2p_listens(host: str, port: int) -> bool:
    """Whether a new TCP connection to host:port is answered by a libp2p listener."""
    try:
        async with asyncio.timeout(DIAL_BACK_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                return MULTISTREAM in await reader.read(64)
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False


async def route(p2p: P2P, peer_id: str) -> Route:
    """How this process is connected to a peer now: directly, only through a relay, or not at all."""
    addresses = await _peer_addresses(p2p, PeerID.from_base58(peer_id))
    if not addresses:
        return "none"
    return "direct" if any("/p2p-circuit" not in a for a in addresses) else "relayed"


_reversals: dict[tuple[int, str], asyncio.Task] = {}  # (P2P handle, peer id): the reversal in flight


async def ensure_direct(p2p: P2P, peer_id: str, timeout: float = REVERSAL_TIMEOUT_S) -> Route:
    """A direct connection to a peer if one can be had (see the module docstring): the route the
    calls that follow will take. Never raises; "none" if the peer does not answer at all.
    Concurrent callers share one reversal: a second relayed call while the first one waits
    for the peer to dial back would keep the relayed connection open."""
    if await route(p2p, peer_id) == "direct":
        return "direct"
    key = id(p2p), peer_id
    if key not in _reversals:
        _reversals[key] = asyncio.create_task(_reverse(p2p, peer_id, timeout))
        _reversals[key].add_done_callback(lambda _: _reversals.pop(key, None))
    return await asyncio.shield(_reversals[key])


async def _reverse(p2p: P2P, peer_id: str, timeout: float) -> Route:
    peer = PeerID.from_base58(peer_id)
    try:
        async with asyncio.timeout(timeout):
            reply = await ReachabilityServicer.get_stub(p2p, peer).rpc_dial_me(
                runtime_pb2.ExpertRequest(metadata=DialMeRequest().encode()))  # fmt: skip
            if DialMeReply.decode(reply.metadata).status == "dialing":
                await p2p._client.disconnect(peer)  # it dials once the relayed connection is gone
            while await route(p2p, peer_id) != "direct":
                await asyncio.sleep(POLL_S)
    except Exception as error:  # timeout, no answer, a peer of another version: the route we have is the answer
        logger.debug("no direct connection to %s: %s", peer_id, error)
    return await route(p2p, peer_id)


def probe(options: NetworkOptions, timeout: float = PROBE_TIMEOUT_S) -> Reachability:
    """Ask the initial peers whether they can dial a daemon listening where this peer will;
    SwarmError if none can be reached at all."""
    loop = EventLoopThread("reachability-probe")
    try:
        return loop.run(_probe(options), timeout)
    except TimeoutError:
        raise SwarmError(f"the initial peers did not answer a reachability check within {timeout:.0f}s") from None
    finally:
        loop.close()


async def _probe(options: NetworkOptions) -> Reachability:
    try:
        p2p = await P2P.create(initial_peers=options.initial_peers, host_maddrs=options.host_maddrs,
                               dht_mode="client", use_relay=False, auto_nat=False, nat_port_map=False)  # fmt: skip
    except Exception as error:  # the daemon fails in many ways; each means the same to the user: one line
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SwarmError(f"could not reach the initial peers {options.initial_peers}: {reason}") from None
    try:
        ports = _ports(options.announce_maddrs or [str(m) for m in await p2p.get_visible_maddrs()])
        helpers = list(dict.fromkeys(Multiaddr(m)["p2p"] for m in options.initial_peers))[:MAX_ASKED]
        answers = dict(zip(helpers, await asyncio.gather(*(_ask_dial_back(p2p, h, ports) for h in helpers))))
    finally:
        await p2p.shutdown()
    told = [status for status in answers.values() if status in ("reachable", "unreachable")]
    direct = sum(s == "reachable" for s in told) > len(told) / 2 if told else None
    return Reachability(direct, answers)


def _ports(maddrs: list[str]) -> list[int]:
    ports = [int(Multiaddr(m)["tcp"]) for m in maddrs if "/tcp/" in m and "/p2p-circuit" not in m]
    return list(dict.fromkeys(ports))[:4] or [1]


async def _ask_dial_back(p2p: P2P, helper: str, ports: list[int]) -> str:
    """One initial peer's verdict ("reachable", "unreachable", or why it could not tell)."""
    try:
        stub = ReachabilityServicer.get_stub(p2p, PeerID.from_base58(helper))
        request = runtime_pb2.ExpertRequest(metadata=DialBackRequest(ports=ports).encode())
        reply = DialBackReply.decode((await stub.rpc_dial_back(request, timeout=2 * DIAL_BACK_TIMEOUT_S + 5)).metadata)
    except Exception as error:  # an old or unreachable helper, garbage: no verdict
        return f"no answer ({type(error).__name__})"
    logger.info("reachability: %s dialed %s: %s %s", helper[-8:], reply.address, reply.status, reply.error)
    return reply.status if reply.status != "cannot tell" else f"cannot tell ({reply.error})"


def require_circuit(dht: DHT, timeout: float = RELAY_TIMEOUT_S) -> list[str]:
    """This peer's /p2p-circuit addresses once its relays have reserved a slot for it;
    SwarmError within `timeout` if none did."""
    def circuits() -> list[str]:  # latest: hivemind otherwise answers with the addresses its daemon had at start
        return [str(m) for m in dht.get_visible_maddrs(latest=True) if "/p2p-circuit" in str(m)]

    try:
        return wait_for(circuits, timeout, "a circuit relay reservation", interval=0.2)
    except WaitTimeout:
        raise SwarmError(f"this peer cannot be reached: nobody can dial it, and no relay among the initial peers "
                         f"gave it a circuit address within {timeout:.0f}s") from None  # fmt: skip


def serve_reachability(dht: DHT) -> tuple[EventLoopThread, P2P]:
    """Answer dial-backs and reversals in a process that has no other P2P services (the
    bootstrap); stop with `loop.close(p2p)`."""
    loop = EventLoopThread("reachability")
    p2p = loop.run(dht.replicate_p2p(), PROBE_TIMEOUT_S)
    loop.run(ReachabilityServicer(p2p).add_p2p_handlers(p2p), PROBE_TIMEOUT_S)
    return loop, p2p


def plan(options: NetworkOptions, reachability: str) -> NetworkOptions:
    """The network options a peer joins with. `reachability`: "auto" (probe, unless the peer
    listens on loopback only, where it can be dialed by all who can reach it), "direct" or
    "relayed" (behind NAT: see NetworkOptions.relayed)."""
    if reachability == "auto":
        if not options.initial_peers or all(_loopback(m) for m in options.host_maddrs):
            return options
        found = probe(options)
        if found.direct is None:
            logger.warning("no initial peer could tell whether others can dial this peer (%s); taking it as "
                           "reachable directly", found.describe())  # fmt: skip
            return options
        logger.info("reachable directly: %s (%s)", found.direct, found.describe())
        relayed = not found.direct
    else:
        relayed = reachability == "relayed"
    if relayed and not options.initial_peers:
        raise SwarmError("a peer behind NAT needs --initial-peers: its relays are taken from them")
    return dataclasses.replace(options, relayed=relayed)


def _loopback(maddr: str) -> bool:
    return "/ip4/" in maddr and ipaddress.ip_address(Multiaddr(maddr)["ip4"]).is_loopback
