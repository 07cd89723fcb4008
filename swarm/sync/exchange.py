"""The payload exchange over P2P, shared by every strategy that swaps payloads (demo, demo-overlap, outer).

Each replica publishes its payload for a step t (for outer steps: the step that ends a round)
and serves it (`rpc_payload`, a long poll that waits for that step's payload up to the
deadline); it gathers the other replicas' payloads for t concurrently until `deadline` seconds
have passed. A replica whose payload has not come by then is left out of that step: nobody
waits longer for a slow or dead peer. Replies are read through their schema (`PayloadReply`);
payloads that fail the strategy's checks are logged and not applied. Every replica decodes
the gathered set in peer-id order, so replicas that gather the same set stay identical.

With its payload each replica sends a fingerprint (8 bytes) of the last set it applied: that
step and the peers whose payloads it used (for DeMo, those that voted). Replicas that applied
the same sets since they last agreed hold the same parameters; when a fingerprint differs from its own, a replica
knows the replicas have drifted apart, and the peer pulls them back together by averaging
parameters (see `swarm.sync.dense`) at the next round. A replica that starts from a
checkpoint has no previous step in common with the others, so it differs.

A replica that asks for a step the others no longer keep learns their steps from the replies
and jumps its step counter ahead, so a late joiner enters the exchange at the next step; but
only to a step that a majority of the replicas it asked report (a step is a claim: one replica
claiming step 10^12 moves nobody).

Bytes are counted as whole messages on both ends: a replica's sent bytes are every reply it
served and every request that got an answer; its received bytes are every request it was
sent and every reply it got. `Exchange.start` returns at once (the gather runs on the p2p
loop), `Exchange.finish` waits for it: a strategy that calls them a step apart overlaps the
exchange with its compute, and `wait_seconds` holds only what the trainer really waited.
With a trace (`swarm-peer --sync-trace FILE`) every publish and every wait is written down
with its CLOCK_MONOTONIC time, which all processes of one host share: benchmarks/sync.py
splits each wait into the part before the last replica had published its payload (waiting
for a slower replica's compute) and the part after it (waiting for the network).

With `spare_batch_size` (`swarm-peer --spare-batch-size N`) a trainer does not sit idle while a
gather it needs is still running: it computes the gradients of spare batches of N windows, which
its next step averages in (swarm/model/train.py). A replica faster than the others, or one whose
exchange is slower than a step, then trains on more windows per step instead of waiting. The
weights still change only by the gathered sets, so replicas that gather the same sets stay
identical (on a shared machine the spare batches slow the other replicas, which can make a
payload miss the deadline: benchmarks/sync.py's outer-overlap-spare run once did). The
spare gradients are taken at the weights before the update waited for, one update stale (for
outer modes, before the outer step's jump), as an overlapped update is. In lockstep demo the
gather is never done the moment it starts, so every step takes at least one spare batch, and a
step ends up to one spare batch later than the gather. Before a checkpoint (`finish` of the
overlapped strategies) the spare batches fall outside any step: wall time, as the idle wait was.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.model.train import Trainer
from swarm.p2p.limits import Busy, PerPeerLimit
from swarm.p2p.messages import MessageError, PayloadReply, PayloadRequest
from swarm.p2p.network import EventLoopThread
from swarm.p2p.reachability import ensure_direct
from swarm.sync.decoupled_momentum import PayloadError

logger = logging.getLogger(__name__)

KEEP_PAYLOADS = 8  # own payloads (steps or outer rounds) kept for late askers: twice MAX_STEPS_IN_FLIGHT
RETRY_S = 0.2  # pause before asking a peer again that could not answer yet
PENDING_STEPS = 16  # steps not yet published that polls may wait for at once (honest ones ask the next one or two)
MAX_STEPS_IN_FLIGHT = 4  # gathers one replica may have running at once (demo-overlap --overlap-steps)
POLLS_PER_PEER = MAX_STEPS_IN_FLIGHT + 1  # long polls one replica may have waiting here at once
FINISH_GRACE_S = 5.0  # beyond the deadline, how long waiting for a gather may take before it is given up
D = TypeVar("D")


class PayloadServicer(ServicerBase):
    """`rpc_payload`: this replica's payload of a step, once it exists (waits up to the deadline)."""

    def __init__(self, block: int, deadline: float):
        self.block, self.deadline = block, deadline
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


@dataclass
class Gathered:
    """What one step's gathering brought: payloads by peer, the newest step each peer that had
    none for us reported, the bytes of the calls, and how long it all took."""

    asked: int = 0
    payloads: dict[str, bytes] = field(default_factory=dict)
    fingerprints: dict[str, bytes] = field(default_factory=dict)
    reported_steps: dict[str, int] = field(default_factory=dict)
    bytes_sent: int = 0  # requests that got an answer
    bytes_received: int = 0  # the answers
    seconds: float = 0.0

    def majority_step(self) -> int:
        """The newest step that a strict majority of the replicas asked report having reached
        (-1 when no majority reports any)."""
        needed = self.asked // 2 + 1
        steps = sorted(self.reported_steps.values(), reverse=True)
        return steps[needed - 1] if len(steps) >= needed else -1

    def take(self, peer_id: str, reply: PayloadReply) -> bool:
        """Keep what a reply says; True when that peer need not be asked again this step."""
        if reply.status == "ok":
            self.payloads[peer_id], self.fingerprints[peer_id] = reply.payload, reply.fingerprint
            return True
        self.reported_steps[peer_id] = max(self.reported_steps.get(peer_id, -1), reply.newest_step)
        return reply.status in ("gone", "wrong block")


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


@dataclass
class Round:
    """One step's exchange in flight: what this replica published, and the gather of the others'."""

    step: int
    own: bytes
    fingerprint: bytes  # what this replica said it applied last, sent with `own`
    gathering: Future


@dataclass
class Exchange:
    """One replica's side of the exchange: publish and gather a step, decode the set in order,
    notice drift, follow a majority that is ahead; and the figures a `SyncStrategy` reports."""

    servicer: PayloadServicer
    p2p: P2P
    loop: EventLoopThread
    own_id: str
    replica_ids: Callable[[], list[str]]  # peer ids of the other replicas of the block, now
    rounds: int = 0  # steps whose set held another replica's payload
    drifted: bool = False  # some replica applied other payloads than we did since the last averaging
    wait_seconds: float = 0.0  # how long the trainer waited for gathers, in all
    round_seconds: float | None = None  # how long the last gather took
    applied: bytes = b"started"  # fingerprint of the last set applied
    _missing: int = 0  # replicas whose payload the last gather went without
    trace: Callable[[dict], None] | None = None  # gets each publish and wait, with its monotonic time
    spare_batch_size: int = 0  # windows of each spare batch a trainer computes instead of waiting (0: it waits)
    _request_bytes: int = 0
    _reply_bytes: int = 0

    @property
    def bytes_sent(self) -> int:
        return self.servicer.bytes_sent + self._request_bytes

    @property
    def bytes_received(self) -> int:
        return self.servicer.bytes_received + self._reply_bytes

    def start(self, step: int, own: bytes) -> Round:
        """Publish this replica's payload of `step` and start gathering the others' (returns at once)."""
        deadline = self.servicer.deadline
        if self.trace:
            self.trace({"event": "publish", "step": step, "t": time.monotonic()})
        self.loop.loop.call_soon_threadsafe(self.servicer.publish, step, own, self.applied)  # runs before the gather
        coro = gather(self.p2p, self.servicer.block, step, self.replica_ids(), deadline)
        return Round(step, own, self.applied, self.loop.submit(asyncio.wait_for(coro, deadline + FINISH_GRACE_S)))

    def finish(self, round_: Round, trainer: Trainer | None = None) -> Gathered:
        """Wait for a round's gather (counted as waiting), count its bytes, and notice drift. With
        `spare_batch_size` and a trainer, the trainer computes spare batches for its next step until
        the gather is done, instead of waiting (the last batch may end a little after it)."""
        spare_from, windows = time.monotonic(), 0
        give_up_at = spare_from + self.servicer.deadline + 2 * FINISH_GRACE_S  # spare batches and waiting together
        while trainer is not None and self.spare_batch_size and not round_.gathering.done() and time.monotonic() < give_up_at:
            trainer.spare_batch(self.spare_batch_size)
            windows += self.spare_batch_size
        waited_from = time.monotonic()
        gathered: Gathered = round_.gathering.result(max(0.0, give_up_at - time.monotonic()))
        waited_to = time.monotonic()
        self.wait_seconds += waited_to - waited_from
        if self.trace:
            self.trace({"event": "wait", "step": round_.step, "seconds": waited_to - waited_from, "t": waited_to,
                        "spare_seconds": waited_from - spare_from if windows else 0.0, "spare_windows": windows})  # fmt: skip
        self.round_seconds = gathered.seconds
        self._request_bytes += gathered.bytes_sent
        self._reply_bytes += gathered.bytes_received
        missing = gathered.asked - len(gathered.payloads)
        if missing and missing != self._missing:  # once per change: a vanished replica stays listed for a while
            logger.warning("step %d: no payload from %d of the %d replicas asked in %.1fs (newest steps reported: %s)",
                           round_.step, missing, gathered.asked, gathered.seconds, gathered.reported_steps)  # fmt: skip
        self._missing = missing
        if any(f != round_.fingerprint for f in gathered.fingerprints.values()) and not self.drifted:
            logger.info("step %d: another replica applied other payloads than we did: parameters will be averaged", round_.step)
            self.drifted = True
        return gathered

    def in_order(self, round_: Round, gathered: Gathered, decode: Callable[[bytes], D]) -> list[tuple[str, D]]:
        """Every payload of the round, own included, decoded in peer-id order, with its sender;
        refused ones are logged and left out."""
        decoded = []
        for peer_id, data in sorted({**gathered.payloads, self.own_id: round_.own}.items()):
            try:
                decoded.append((peer_id, decode(data)))
            except PayloadError as error:
                logger.warning("refused the step %d payload of %s: %s", round_.step, peer_id, error)
        return decoded

    def applied_set(self, round_: Round, peer_ids: list[str]) -> None:
        """The round's update was made of the payloads of `peer_ids`: this replica's fingerprint,
        and one more round exchanged if another replica's payload was among them."""
        self.applied = applied_fingerprint(round_.step, peer_ids)
        self.rounds += int(any(peer_id != self.own_id for peer_id in peer_ids))

    def follow_majority(self, gathered: Gathered, trainer: Trainer, round_steps: int = 1) -> bool:
        """Jump the trainer's step ahead to where a majority of the replicas asked is, if that is
        past the end of the round this replica is in (rounds of `round_steps` steps: an
        overlapped outer round is applied mid-round, when the others may well have ended the
        round this replica is still in); True if it jumped."""
        ahead = gathered.majority_step()
        round_end = -(-(trainer.step_count + 1) // round_steps) * round_steps
        if ahead <= round_end:
            return False
        logger.info("a majority of the replicas is at step %d: jumping from %d", ahead, trainer.step_count)
        trainer.step_count = ahead - 1  # the trainer adds one after this update
        return True

    def averaged(self, step: int) -> None:
        """The replicas averaged their parameters at `step`: from here they hold the same again."""
        self.drifted, self.applied = False, applied_fingerprint(step, ["averaged"])


class Exchanging:
    """The `SyncStrategy` figures of a strategy that swaps payloads through `self.exchange`."""

    exchange: Exchange

    @property
    def steps(self) -> int:
        return self.exchange.rounds

    @property
    def bytes_sent(self) -> int:
        return self.exchange.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.exchange.bytes_received

    @property
    def round_seconds(self) -> float | None:
        return self.exchange.round_seconds

    @property
    def wait_seconds(self) -> float:
        return self.exchange.wait_seconds

    def may_have_drifted(self) -> bool:
        return self.exchange.drifted

    def averaged(self, step: int) -> None:
        self.exchange.averaged(step)

    def finish(self, trainer: Trainer) -> None:
        pass


def json_lines(path: str) -> Callable[[dict], None]:
    """A trace that appends each event to `path` as a JSON line (line-buffered, so each is on disk
    as it happens, and a peer killed mid-run leaves whole lines; the file closes at exit)."""
    out = open(path, "a", buffering=1)

    def write(event: dict) -> None:
        out.write(json.dumps(event) + "\n")

    return write


def applied_fingerprint(step: int, peer_ids: list[str]) -> bytes:
    """8 bytes naming one step's update: equal for replicas that applied the same payloads."""
    return hashlib.blake2b(f"{step}:{','.join(sorted(peer_ids))}".encode(), digest_size=8).digest()
