"""The payload exchange between peers over P2P: the service that answers for this replica's
payloads, and the gather that asks the others for theirs (an exchange's `Transport`).

Each replica publishes its payload for a step t (for outer steps: the step that ends a round)
and serves it (`rpc_payload`, a long poll that waits for that step's payload up to the
deadline); it gathers the other replicas' payloads for t concurrently until `deadline` seconds
have passed. A replica whose payload has not come by then is left out of that step: nobody
waits longer for a slow or dead peer. Replies are read through their schema (`PayloadReply`).
Bytes are counted as whole messages on both ends (see exchange.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.p2p.limits import OPEN, Busy, CallerGate, PerPeerLimit
from swarm.p2p.messages import MessageError, PayloadReply, PayloadRequest
from swarm.p2p.network import EventLoopThread
from swarm.p2p.reachability import ensure_direct
from swarm.sync.exchange import GATHER_GRACE_S, MAX_STEPS_IN_FLIGHT, Gathered

logger = logging.getLogger(__name__)

KEEP_PAYLOADS = 8  # own payloads (steps or outer rounds) kept for late askers: twice MAX_STEPS_IN_FLIGHT
RETRY_S = 0.2  # pause before asking a peer again that could not answer yet
PENDING_STEPS = 16  # steps not yet published that polls may wait for at once (honest ones ask the next one or two)
POLLS_PER_PEER = MAX_STEPS_IN_FLIGHT + 1  # long polls one replica may have waiting here at once


class PayloadServicer(ServicerBase):
    """`rpc_payload`: this replica's payload of a step, once it exists (waits up to the deadline)."""

    def __init__(self, block: int, deadline: float, gate: CallerGate = OPEN):
        """`gate`: who is answered at all (members only, in a members-only swarm: gate.py)."""
        self.block, self.deadline, self.gate = block, deadline, gate
        self.payloads: dict[int, tuple[bytes, bytes]] = {}  # step: (payload, parameter fingerprint)
        self.bytes_sent = 0  # every reply, whole
        self.bytes_received = 0  # every request, whole
        self._published: dict[int, asyncio.Event] = {}
        self._waiting: dict[int, int] = {}  # step: polls waiting for it now
        self.limit = PerPeerLimit(POLLS_PER_PEER)

    def _event(self, step: int) -> asyncio.Event:
        return self._published.setdefault(step, asyncio.Event())

    async def _published_in_time(self, step: int) -> bool:
        """Wait up to the deadline for step's payload. An asker names any step it likes: an event
        is kept only while someone waits for it (or once published), and for a bounded number of
        steps at once, so polls for made-up future steps cannot pile up here."""
        if step not in self._published and len(self._waiting) >= PENDING_STEPS:
            return False
        event = self._event(step)
        self._waiting[step] = self._waiting.get(step, 0) + 1
        try:
            await asyncio.wait_for(event.wait(), self.deadline)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiting[step] -= 1
            if not self._waiting[step]:
                del self._waiting[step]
                if not event.is_set():
                    self._published.pop(step, None)

    def publish(self, step: int, data: bytes, fingerprint: bytes) -> None:
        """Called on the event loop: make step's payload available and drop all but the newest few."""
        self.payloads[step] = data, fingerprint
        self._event(step).set()
        for old in sorted(self.payloads)[:-KEEP_PAYLOADS]:
            self.payloads.pop(old, None)
        for old in [s for s in self._published if s < min(self.payloads)]:
            self._published.pop(old, None)

    async def rpc_payload(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        self.bytes_received += request.ByteSize()
        try:
            if not await self.gate.admits(context.remote_id):
                reply = PayloadReply(status="not a member")
            else:
                with self.limit.admit(context):
                    reply = await self._payload(request)
        except Busy:
            reply = self._status("busy")
        response = runtime_pb2.ExpertResponse(metadata=reply.encode())
        self.bytes_sent += response.ByteSize()
        return response

    def _status(self, status: str) -> PayloadReply:
        return PayloadReply(status=status, newest_step=max(self.payloads, default=-1))

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        try:
            asked = PayloadRequest.decode(request.metadata)
        except MessageError:
            return self._status("wrong block")
        if asked.block != self.block:
            return self._status("wrong block")
        if self.payloads and asked.step < min(self.payloads):  # dropped, or from before this replica began
            return self._status("gone")
        if not await self._published_in_time(asked.step):
            return self._status("not yet")
        if asked.step not in self.payloads:
            return self._status("gone")
        data, fingerprint = self.payloads[asked.step]
        return PayloadReply(status="ok", payload=data, fingerprint=fingerprint, newest_step=asked.step)


async def gather(p2p: P2P, block: int, step: int, peer_ids: list[str], deadline: float) -> Gathered:
    """Ask every peer for its step payload at once; keep what arrives before the deadline."""
    result = Gathered(asked=len(peer_ids))
    started = time.monotonic()
    stop_at = started + deadline
    request = runtime_pb2.ExpertRequest(metadata=PayloadRequest(block=block, step=step).encode())

    async def ask(peer_id: str) -> None:
        await ensure_direct(p2p, peer_id, deadline)  # a replica behind NAT dials us back (once): relays cut at 128 KiB
        stub = PayloadServicer.get_stub(p2p, PeerID.from_base58(peer_id))
        while (left := stop_at - time.monotonic()) > 0:
            try:
                response = await stub.rpc_payload(request, timeout=left)
            except Exception:  # not up yet, gone, or too slow: ask again while time is left
                await asyncio.sleep(min(RETRY_S, max(0.0, stop_at - time.monotonic())))
                continue
            result.bytes_sent += request.ByteSize()
            result.bytes_received += response.ByteSize()
            try:
                reply = PayloadReply.decode(response.metadata)
            except MessageError as error:
                logger.warning("step %d: %s sent a malformed reply (%s); left out of this step", step, peer_id, error)
                return
            if result.take(peer_id, reply):
                return
            await asyncio.sleep(RETRY_S)

    await asyncio.gather(*(ask(peer_id) for peer_id in peer_ids))
    result.seconds = time.monotonic() - started
    return result


class P2PTransport:
    """An exchange's payloads between peers: published to this peer's `PayloadServicer`,
    gathered from the others over P2P on the event loop thread."""

    def __init__(self, servicer: PayloadServicer, p2p: P2P, loop: EventLoopThread):
        self.servicer, self.p2p, self.loop = servicer, p2p, loop
        self.deadline = servicer.deadline

    def served_bytes(self) -> tuple[int, int]:
        return self.servicer.bytes_sent, self.servicer.bytes_received

    def publish(self, step: int, payload: bytes, fingerprint: bytes) -> None:
        self.loop.loop.call_soon_threadsafe(self.servicer.publish, step, payload, fingerprint)  # runs before the gather

    def gather(self, step: int, peer_ids: list[str]) -> Future:
        coro = gather(self.p2p, self.servicer.block, step, peer_ids, self.deadline)
        return self.loop.submit(asyncio.wait_for(coro, self.deadline + GATHER_GRACE_S))
