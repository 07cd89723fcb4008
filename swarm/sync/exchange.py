"""The DeMo exchange over P2P: the replicas of one block swap payloads every step.

Each replica publishes its payload for step t and serves it (`rpc_payload`, a long poll that
waits for that step's payload up to the deadline); it gathers the other replicas' payloads
for step t concurrently until `deadline` seconds have passed. A replica whose payload has
not come by then is left out of the step: nobody waits longer for a slow or dead peer.
Replies are read through their schema (`PayloadReply`); payloads that fail the checks of
`decode_payload` are logged and not applied. Every replica decodes the gathered set in
peer-id order, so replicas that gather the same set stay identical.

With its payload each replica sends a fingerprint (8 bytes) of what it applied the step
before: the step and the peers whose payloads it used. Replicas that applied the same sets
since they last agreed hold the same parameters; when a fingerprint differs from its own, a
replica knows the replicas have drifted apart, and the peer pulls them back together by
averaging parameters (see `swarm.sync.dense`) at the next round. A replica that starts from
a checkpoint has no previous step in common with the others, so it differs.

A replica that asks for a step the others no longer keep learns their steps from the replies
and jumps its step counter ahead, so a late joiner enters the exchange at the next step; but
only to a step that a majority of the replicas it asked report (a step is a claim: one replica
claiming step 10^12 moves nobody).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.model.train import Trainer
from swarm.p2p.limits import Busy, PerPeerLimit
from swarm.p2p.messages import MessageError, PayloadReply, PayloadRequest
from swarm.p2p.network import EventLoopThread
from swarm.sync.decoupled_momentum import DeMoReplica, PayloadError, decode_payload, encode_payload

logger = logging.getLogger(__name__)

KEEP_STEPS = 8  # payloads kept for late askers
RETRY_S = 0.2  # pause before asking a peer again that could not answer yet
POLLS_PER_PEER = 2  # long polls one replica may have waiting here at once (it asks one step at a time)


class PayloadServicer(ServicerBase):
    """`rpc_payload`: this replica's payload of a step, once it exists (waits up to the deadline)."""

    def __init__(self, block: int, deadline: float):
        self.block, self.deadline = block, deadline
        self.payloads: dict[int, tuple[bytes, bytes]] = {}  # step: (payload, parameter fingerprint)
        self.bytes_sent = 0
        self._published: dict[int, asyncio.Event] = {}
        self.limit = PerPeerLimit(POLLS_PER_PEER)

    def _event(self, step: int) -> asyncio.Event:
        return self._published.setdefault(step, asyncio.Event())

    def publish(self, step: int, data: bytes, fingerprint: bytes) -> None:
        """Called on the event loop: make step's payload available and drop old ones."""
        self.payloads[step] = data, fingerprint
        self._event(step).set()
        for old in [s for s in self.payloads if s <= step - KEEP_STEPS]:
            self.payloads.pop(old, None)
            self._published.pop(old, None)

    async def rpc_payload(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        try:
            with self.limit.admit(context):
                reply = await self._payload(request)
        except Busy:
            reply = self._status("busy")
        return runtime_pb2.ExpertResponse(metadata=reply.encode())

    def _status(self, status: str) -> PayloadReply:
        return PayloadReply(status=status, newest_step=max(self.payloads, default=-1))

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        try:
            asked = PayloadRequest.decode(request.metadata)
        except MessageError:
            return self._status("wrong block")
        if asked.block != self.block:
            return self._status("wrong block")
        if asked.step < max(self.payloads, default=-1) - KEEP_STEPS + 1:
            return self._status("gone")
        try:
            await asyncio.wait_for(self._event(asked.step).wait(), self.deadline)
        except TimeoutError:
            return self._status("not yet")
        if asked.step not in self.payloads:
            return self._status("gone")
        data, fingerprint = self.payloads[asked.step]
        self.bytes_sent += len(data) + len(fingerprint)
        return PayloadReply(status="ok", payload=data, fingerprint=fingerprint, newest_step=asked.step)


@dataclass
class Gathered:
    """What one step's gathering brought: payloads by peer, and the newest step each peer that
    had none for us reported."""

    asked: int = 0
    payloads: dict[str, bytes] = field(default_factory=dict)
    fingerprints: dict[str, bytes] = field(default_factory=dict)
    reported_steps: dict[str, int] = field(default_factory=dict)

    def majority_step(self) -> int:
        """The newest step that a strict majority of the replicas asked report having reached
        (-1 when no majority reports any)."""
        needed = self.asked // 2 + 1
        steps = sorted(self.reported_steps.values(), reverse=True)
        return steps[needed - 1] if len(steps) >= needed else -1


async def gather(p2p: P2P, block: int, step: int, peer_ids: list[str], deadline: float) -> Gathered:
    """Ask every peer for its step payload at once; keep what arrives before the deadline."""
    result = Gathered(asked=len(peer_ids))
    stop_at = time.monotonic() + deadline
    request = runtime_pb2.ExpertRequest(metadata=PayloadRequest(block=block, step=step).encode())

    async def ask(peer_id: str) -> None:
        stub = PayloadServicer.get_stub(p2p, PeerID.from_base58(peer_id))
        while (left := stop_at - time.monotonic()) > 0:
            try:
                reply = PayloadReply.decode((await stub.rpc_payload(request, timeout=left)).metadata)
            except MessageError as error:
                logger.warning("step %d: %s sent a malformed reply (%s); left out of this step", step, peer_id, error)
                return
            except Exception:  # not up yet, gone, or too slow: ask again while time is left
                await asyncio.sleep(min(RETRY_S, max(0.0, stop_at - time.monotonic())))
                continue
            if reply.status == "ok":
                result.payloads[peer_id], result.fingerprints[peer_id] = reply.payload, reply.fingerprint
                return
            result.reported_steps[peer_id] = max(result.reported_steps.get(peer_id, -1), reply.newest_step)
            if reply.status in ("gone", "wrong block"):
                return
            await asyncio.sleep(RETRY_S)

    await asyncio.gather(*(ask(peer_id) for peer_id in peer_ids))
    return result


@dataclass
class DeMoSync:
    """`--sync demo`: the trainer's update when the block has replicas (a `SyncStrategy`)."""

    replica: DeMoReplica
    servicer: PayloadServicer
    p2p: P2P
    loop: EventLoopThread
    own_id: str
    replica_ids: Callable[[], list[str]]  # peer ids of the other replicas of the block, now
    bytes_received: int = 0
    refused: int = 0
    steps: int = 0
    drifted: bool = False  # some replica applied other payloads than we did since the last averaging
    round_seconds: float | None = None  # how long the last gather took
    applied: bytes = b"started"  # fingerprint of the payloads applied at the previous step

    @property
    def bytes_sent(self) -> int:
        return self.servicer.bytes_sent

    def may_have_drifted(self) -> bool:
        return self.drifted

    def averaged(self, step: int) -> None:
        """The replicas averaged their parameters at `step`: from here they hold the same again."""
        self.drifted, self.applied = False, applied_fingerprint(step, ["averaged"])

    def update(self, trainer: Trainer) -> None:
        step = trainer.step_count
        own = encode_payload(self.replica.make_payload(trainer.config.lr_at(step)), self.replica.config.value_bits)
        fingerprint = self.applied
        self.loop.loop.call_soon_threadsafe(self.servicer.publish, step, own, fingerprint)  # before the gather
        others = self.replica_ids()
        deadline = self.servicer.deadline
        started = time.monotonic()
        gathered = self.loop.run(gather(self.p2p, self.servicer.block, step, others, deadline), deadline + 5)
        self.round_seconds = time.monotonic() - started
        self.bytes_received += sum(len(d) + len(gathered.fingerprints[p]) for p, d in gathered.payloads.items())
        if any(f != fingerprint for f in gathered.fingerprints.values()) and not self.drifted:
            logger.info("step %d: another replica applied other payloads than we did: parameters will be averaged", step)
            self.drifted = True
        payloads, used = [], []
        for peer_id, data in sorted({**gathered.payloads, self.own_id: own}.items()):
            try:
                payloads.append(decode_payload(data, self.replica))
                used.append(peer_id)
            except PayloadError as error:
                self.refused += 1
                logger.warning("refused the step %d payload of %s: %s", step, peer_id, error)
        self.replica.apply(payloads)
        self.applied = applied_fingerprint(step, used)
        self.steps += 1
        if (ahead := gathered.majority_step()) > step + 1:
            logger.info("a majority of the replicas is at step %d: jumping from %d", ahead, step)
            trainer.step_count = ahead - 1  # the trainer adds one after this update


def applied_fingerprint(step: int, peer_ids: list[str]) -> bytes:
    """8 bytes naming one step's update: equal for replicas that applied the same payloads."""
    return hashlib.blake2b(f"{step}:{','.join(sorted(peer_ids))}".encode(), digest_size=8).digest()
