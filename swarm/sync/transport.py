"""The payload exchange between peers over P2P: the service that answers for this replica's
payloads, and the gather that asks the others for theirs (an exchange's `Transport`).

Each replica publishes its payload for a step t (for outer steps: the step that ends a round)
and serves it (`rpc_payload`, a long poll that waits for that step's payload up to the
deadline); it gathers the other replicas' payloads for t concurrently, for at most `deadline`
seconds. A replica whose payload has not come by then is left out of that step: nobody
waits longer for a slow or dead peer. Replies are read through their schema (`PayloadReply`).
Bytes are counted as whole messages on both ends (see exchange.py).

Only a punctual replica is waited for that long (`Punctuality`): in this replica's first
gather with others, every one; from then on, those whose last payload came within the deadline.
In an open swarm a key is free: one key whose record names it a replica of the block and that
never answers, or answers "not yet", held every step to the deadline, forever (issue 57); now it
costs only this replica's first gather (all are waited for there, so that replicas that start
together meet at their first step), and a key new after that costs nothing. A gather ends when
the punctual replicas' asks have ended; the others' asks go on out of the trainer's way until
the deadline (one such ask per replica at a time), and a payload that comes by then makes its
replica punctual again: an honest replica that missed a step, or one that joined later, is
waited for in full from a round or two on. Replicas punctual to each other wait for each other
as before, and so still apply the same sets. A payload that came in time but failed the
strategy's checks when decoded (junk bytes, NaN, values out of bounds: `Transport.judged`) makes
its replica unpunctual until one of its payloads decodes, which only one that comes while a
gather is open can (a trailing ask's payload is never decoded): a key delivering junk just before
each deadline held every step to it (issue 57) and now costs one deadline. A payload that decodes
but that the strategy's update left out (contradicted, or a vote set aside: `Transport.set_aside`)
benches its replica: set aside n times in a row, it is not waited for in full in the next 2^n
gathers (n at most `MAX_BENCH_STRIKES`), and one of its payloads that counts ends the bench at once.
Free keys whose payloads a lone replica's vote sets aside every step (nothing, or its own payload
negated) were waited for in full every step; now they are waited for at gathers 1, 4, 9, 18, ...
and about 64 apart at most, while an honest replica the others contradicted a while is waited for
again as soon as one of its payloads counts (it still comes to gathers while they are open: a
bench is no ban). What timing cannot deny a key: a payload that decodes and counts, delivered
just before each deadline, keeps it punctual, waited for in full, as an honest replica that slow
would be. What this costs an honest replica: one
that falls more than a deadline behind the others at once (a stall of over two deadlines) is no
longer waited for until its payloads come in time again; it still applies theirs (kept for late
askers), but they go on without its own, where waiting in full every step let it catch up.

A replica that answered "gone, my newest step is n" keeps no payload older than its newest
`KEEP_PAYLOADS`, now or later (its newest step only grows): with payloads d steps apart (1 for
DeMo, a round for outer steps; read off this replica's own last two gathers), none of a step
below n - (KEEP_PAYLOADS - 1) d. So it is not asked again while this replica's step is at least
d below that: its last answer stands in the gather for it (its newest step, as the jump rule
reads it, exchange.py). Free keys claiming a step far ahead were asked,
and answered at once, every step: a round trip each, beside a lone replica's 60 ms steps
(issue 57's jump rows: 1.55 times its seconds a step alone with 4 keys); now each is heard
once. An honest replica restarted from an older checkpoint after saying "gone" is asked again
only once this one reaches the step it had said.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterable
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
MAX_BENCH_STRIKES = 6  # a sender set aside n times in a row is not waited for in the next 2^n gathers, n <= this
PENDING_STEPS = 16  # steps far from this replica's own that polls may wait for at once (made-up ones, mostly)
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

    def _near(self, step: int) -> bool:
        """Whether `step` is one an honest replica may ask for now: a kept one, or one of the next
        `MAX_STEPS_IN_FLIGHT` (a replica ahead of this one by the gathers it may have in flight)."""
        return bool(self.payloads) and min(self.payloads) <= step <= max(self.payloads) + MAX_STEPS_IN_FLIGHT

    async def _published_in_time(self, step: int) -> bool:
        """Wait up to the deadline for step's payload. An asker names any step it likes: an event
        is kept only while someone waits for it (or once published). Steps near this replica's own
        may always be waited for (a bounded window); others only `PENDING_STEPS` at once, so polls
        for made-up future steps can neither pile up here nor take an honest poll's place."""
        far = [s for s in self._waiting if not self._near(s)]
        if step not in self._published and not self._near(step) and len(far) >= PENDING_STEPS:
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


class Punctuality:
    """Which replicas a gather waits for in full (module docstring), as this replica's gathers saw
    them; read and written on the event loop alone."""

    def __init__(self) -> None:
        self.met = False  # a gather that asked another replica has ended
        self.punctual: set[str] = set()  # replicas whose last payload came within the deadline
        self.trailing: dict[str, asyncio.Task] = {}  # replicas whose ask goes on past the gather it began in
        self.gone: dict[str, int] = {}  # replicas that answered "gone": the newest step each reported
        self.refused: set[str] = set()  # replicas whose last payload judged failed the checks: not punctual
        self.last_step: int | None = None  # the step of this replica's last gather
        self.gathers = 0  # gathers that have ended
        self.strikes: dict[str, int] = {}  # replicas whose payloads the strategy set aside, times in a row
        self.benched: dict[str, int] = {}  # replicas not waited for in full until this many gathers have ended
        self.bytes_sent = 0  # requests of those asks that got an answer
        self.bytes_received = 0  # their answers

    def known_gone(self, peer_ids: Iterable[str], step: int) -> dict[str, int]:
        """Of `peer_ids`, those whose "gone" answer holds for `step` too (module docstring), with the
        newest step each reported; answers that no longer hold, or of replicas no longer listed, are
        forgotten. Until two gathers show the payloads' spacing (or where the step went back), none."""
        spacing = step - self.last_step if self.last_step is not None and step > self.last_step else None
        self.last_step = step
        listed = set(peer_ids)
        self.gone = {p: newest for p, newest in self.gone.items()
                     if p in listed and spacing and step + KEEP_PAYLOADS * spacing <= newest}  # fmt: skip
        return dict(self.gone)

    def waited_in_full(self, peer_ids: Iterable[str]) -> list[str]:
        """The replicas a gather waits for up to the deadline: all in the first gather, then the punctual
        ones; neither those benched (`set_aside`)."""
        return [p for p in peer_ids if (not self.met or p in self.punctual) and self.benched.get(p, 0) <= self.gathers]

    def ended(self, gathered: Gathered, asks: dict[str, asyncio.Task], sinks: dict[str, Gathered]) -> None:
        """A gather ended: those whose payload it brought are punctual (only those: replicas no longer
        asked are forgotten). An ask still running goes on (its replies to a sink of its own) until
        the deadline, as its replica's trailing ask, or is cancelled if that replica has one already
        (so no replica's service is asked more than once beyond the gathers). The task is kept here:
        the event loop holds a task only weakly, and one collected mid-flight never ends, which
        left its replica trailing, never waited for again."""
        self.met = self.met or bool(asks)
        self.gathers += 1
        self.punctual = {p for p in asks if p in gathered.payloads and p not in self.refused}
        self.strikes = {p: n for p, n in self.strikes.items() if p in asks}  # replicas no longer asked are forgotten
        self.benched = {p: until for p, until in self.benched.items() if p in asks and until > self.gathers}
        for peer_id, task in asks.items():
            if task.done():
                continue
            if peer_id in self.trailing:
                task.cancel()
                continue
            self.trailing[peer_id] = task
            sinks[peer_id] = Gathered(asked=1)
            task.add_done_callback(functools.partial(self._trailed, peer_id, sinks[peer_id]))

    def _trailed(self, peer_id: str, sink: Gathered, _: asyncio.Task) -> None:
        """A trailing ask ended: its bytes, and its replica punctual again if its payload came in time."""
        del self.trailing[peer_id]
        self.bytes_sent += sink.bytes_sent
        self.bytes_received += sink.bytes_received
        if peer_id in sink.payloads and peer_id not in self.refused:
            self.punctual.add(peer_id)

    def judged(self, decoded: Iterable[str], refused: Iterable[str]) -> None:
        """The payloads of a gather were decoded: a replica whose payload was refused is punctual
        no more, nor made so by payloads that come in time but are never judged (a trailing ask's);
        one whose payload decoded is taken back (module docstring)."""
        self.refused.difference_update(decoded)
        self.refused.update(refused)
        self.punctual.difference_update(refused)

    def set_aside(self, uncounted: Iterable[str], counted: Iterable[str]) -> None:
        """The strategy's update was made without the decoded payloads of `uncounted` (contradicted, or
        a vote set aside: swarm/sync/evidence.py) and with those of `counted`: one set aside n times in a
        row is not waited for in full in the next 2^n gathers (n at most `MAX_BENCH_STRIKES`), one that
        counts is waited for again at once (module docstring)."""
        for peer_id in counted:
            self.strikes.pop(peer_id, None)
            self.benched.pop(peer_id, None)
        for peer_id in uncounted:
            self.strikes[peer_id] = min(self.strikes.get(peer_id, 0) + 1, MAX_BENCH_STRIKES)
            self.benched[peer_id] = self.gathers + 2 ** self.strikes[peer_id]


async def gather(p2p: P2P, block: int, step: int, peer_ids: list[str], deadline: float,
                 punctuality: Punctuality | None = None) -> Gathered:  # fmt: skip
    """Ask every peer for its step payload at once (but those known to keep no payload of `step`: their
    last answer stands); keep what arrives until every ask of a replica waited for in full has
    ended, at most the deadline (`Punctuality`; without one, all are)."""
    punctuality = punctuality if punctuality is not None else Punctuality()
    result = Gathered(asked=len(peer_ids))
    started = time.monotonic()
    stop_at = started + deadline
    request = runtime_pb2.ExpertRequest(metadata=PayloadRequest(block=block, step=step).encode())
    sinks = dict.fromkeys(peer_ids, result)  # where each ask's replies go: the result, while the gather is open

    async def ask(peer_id: str) -> None:
        try:
            stub = PayloadServicer.get_stub(p2p, PeerID.from_base58(peer_id))
        except ValueError:  # a record may name any string: that one is no peer (counted as missing, see exchange.py)
            logger.debug("step %d: %r is not a peer id; left out of this step", step, peer_id)
            return
        await ensure_direct(p2p, peer_id, deadline)  # a replica behind NAT dials us back (once): relays cut at 128 KiB
        while (left := stop_at - time.monotonic()) > 0:
            try:
                response = await stub.rpc_payload(request, timeout=left)
            except Exception:  # not up yet, gone, or too slow: ask again while time is left
                await asyncio.sleep(min(RETRY_S, max(0.0, stop_at - time.monotonic())))
                continue
            sink = sinks[peer_id]
            sink.bytes_sent += request.ByteSize()
            sink.bytes_received += response.ByteSize()
            try:
                reply = PayloadReply.decode(response.metadata)
            except MessageError as error:
                logger.warning("step %d: %s sent a malformed reply (%s); left out of this step", step, peer_id, error)
                return
            if reply.status == "gone":
                punctuality.gone[peer_id] = reply.newest_step
            if sink.take(peer_id, reply):
                return
            await asyncio.sleep(RETRY_S)

    gone = punctuality.known_gone(peer_ids, step)
    result.reported_steps.update(gone)
    asks = {peer_id: asyncio.ensure_future(ask(peer_id)) for peer_id in peer_ids if peer_id not in gone}
    waited = [asks[p] for p in punctuality.waited_in_full(asks)]
    try:
        if waited:
            await asyncio.wait(waited, timeout=deadline)
    except BaseException:  # cancelled: no ask outlives its gather
        for task in asks.values():
            task.cancel()
        raise
    result.seconds = time.monotonic() - started
    punctuality.ended(result, asks, sinks)
    return result


class P2PTransport:
    """An exchange's payloads between peers: published to this peer's `PayloadServicer`,
    gathered from the others over P2P on the event loop thread."""

    def __init__(self, servicer: PayloadServicer, p2p: P2P, loop: EventLoopThread):
        self.servicer, self.p2p, self.loop = servicer, p2p, loop
        self.deadline = servicer.deadline
        self.punctuality = Punctuality()

    def served_bytes(self) -> tuple[int, int]:
        """Served, and the asks that went on past their gather (counted in no `Gathered`)."""
        return (self.servicer.bytes_sent + self.punctuality.bytes_sent,
                self.servicer.bytes_received + self.punctuality.bytes_received)  # fmt: skip

    def publish(self, step: int, payload: bytes, fingerprint: bytes) -> None:
        self.loop.loop.call_soon_threadsafe(self.servicer.publish, step, payload, fingerprint)  # runs before the gather

    def gather(self, step: int, peer_ids: list[str]) -> Future:
        coro = gather(self.p2p, self.servicer.block, step, peer_ids, self.deadline, self.punctuality)
        return self.loop.submit(asyncio.wait_for(coro, self.deadline + GATHER_GRACE_S))

    def judged(self, decoded: list[str], refused: list[str]) -> None:
        """Called by the trainer's thread; the punctuality is the event loop's (`Punctuality.judged`),
        and a gather submitted after this call sees it."""
        self.loop.loop.call_soon_threadsafe(self.punctuality.judged, decoded, refused)

    def set_aside(self, uncounted: list[str], counted: list[str]) -> None:
        """As `judged`, for `Punctuality.set_aside`."""
        self.loop.loop.call_soon_threadsafe(self.punctuality.set_aside, uncounted, counted)
