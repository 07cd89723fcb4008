"""The payload exchange, shared by every strategy that swaps payloads (demo, demo-overlap, outer, outer-overlap).

Each replica publishes its payload for a step t (for outer steps: the step that ends a round)
and gathers the other replicas' payloads for t until the deadline, through a `Transport`:
between peers over P2P (transport.py), or between replicas in one process (in_process.py, for
benchmarks). A replica whose payload has not come by then is left out of that step: nobody
waits longer for a slow or dead peer. Over P2P, after a replica's first gather, only those whose
last payload came in time are waited for that long, so a key that never delivers costs the
deadline once, not every step, and one whose payload failed the strategy's checks is not waited
for again until one decodes (transport.py). Payloads that fail the strategy's checks are
logged and not applied, and say nothing about drift. Every replica decodes the gathered set in
peer-id order, so replicas that gather the same set stay identical.

With its payload each replica sends a fingerprint (8 bytes) of the last set it applied: that
step and the peers whose payloads it used (for DeMo, those that voted). Replicas that applied
the same sets since they last agreed hold the same parameters; when a fingerprint differs from its own, a replica
knows the replicas have drifted apart, and the peer pulls them back together by averaging
parameters (see `swarm.sync.dense`) at the next round. A replica that starts from a
checkpoint has no previous step in common with the others, so it differs.

A replica that asks for a step the others no longer keep learns their steps from the replies
and jumps its step counter ahead, so a late joiner enters the exchange at the next step; but
only to a step that a majority of the replicas it asked report, and at least two of them (a
step is a claim: one replica claiming step 10^12 moves nobody, even when it is the only other
replica), and only within its jump budget (`jump_budget`): at most `MAX_JUMP_STEPS` at once, and
over the replica's whole life at most its allowance (`allowance_for`: `JUMP_SHARE` of its
schedule, at most `MAX_JUMP_STEPS`) plus `JUMP_SHARE` of the steps it trained. In an open swarm
a key is free: two keys answering "gone, the newest step is the one asked plus 1000" made a
majority on every step, so a lone replica's counter moved 1000 steps a step, its rate reached
the schedule's floor within about 100 steps and a `--max-steps` run ended at once (issue 57).
Nothing else a replica can check tells a real replica ahead from a made-up one: a step is not in
the payload, a payload of any step is as easy to make up as a reply, and a checkpoint's stamp is
a claim too. So the bound is on what all claims together may move, in steps of the schedule they
shift: any number of keys repeating a claim move it by at most a tenth of its length (and never
more than `MAX_JUMP_STEPS`) plus a tenth of the steps trained, in all; a late joiner enters at the
others' step once (a save or two behind: inside the allowance of a schedule ten saves long or
more); a replica that fell behind for a while rejoins from what its training earned back. A claim
past the budget is refused whole (no jump part-way: nobody is there). A replica behind the
others' kept payloads that does not jump (one of a block of two, or one past its budget) steps
alone, without waiting, while the others wait up to the deadline for each of its steps, until it
reaches them and they are in step again. The peer's `--max-steps` counts the steps it trained
from the step it started at, never the steps a jump added (swarm/peer/training.py), so jumps cannot
end a run either.

Bytes are counted as whole messages on both ends: a replica's sent bytes are every reply it
served and every request that got an answer; its received bytes are every request it was
sent and every reply it got. `Exchange.start` returns at once (the gather runs on the p2p
loop), `Exchange.collect` waits for it: a strategy that calls them a step apart overlaps the
exchange with its compute, and `wait_seconds` holds only what the trainer really waited.
With a trace (`swarm-peer --sync-trace FILE`) every publish and every wait is written down
with its CLOCK_MONOTONIC time, which all processes of one host share: benchmarks/sync.py
splits each wait into the part before the last replica had published its payload (waiting
for a slower replica's compute) and the part after it (waiting for the network).

With a `spare_batch` callback (the peer hands one for `swarm-peer --spare-batch-size N`) a
trainer does not sit idle while a gather it needs is still running: it computes the gradients
of spare batches of N windows, which its next step averages in (swarm/model/train.py). A
replica faster than the others, or one whose exchange is slower than a step, then trains on
more windows per step instead of waiting. The
weights still change only by the gathered sets, so replicas that gather the same sets stay
identical (on a shared machine the spare batches slow the other replicas, which can make a
payload miss the deadline: benchmarks/sync.py's outer-overlap-spare run once did). The
spare gradients are taken at the weights before the update waited for, one update stale (for
outer modes, before the outer step's jump), as an overlapped update is. In lockstep demo the
gather is never done the moment it starts, so every step takes at least one spare batch, and a
step ends up to one spare batch later than the gather. Before a checkpoint (`settle` of the
overlapped strategies) the spare batches fall outside any step: wall time, as the idle wait was.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from swarm.model.train import Trainer
from swarm.p2p.ledger import Witness
from swarm.sync.compression import PayloadError

logger = logging.getLogger(__name__)

MAX_STEPS_IN_FLIGHT = 4  # gathers one replica may have running at once (demo-overlap --overlap-steps)
GATHER_GRACE_S = 5.0  # beyond the deadline, how long waiting for a gather may take before it is given up
MIN_REPORTERS = 2  # replicas that must report a step before anyone jumps to it: one voice is never enough
MAX_JUMP_STEPS = 1000  # the most a jump may move a replica's step: a joiner is at most a save or two behind
JUMP_SHARE = 0.1  # what a replica's jumps may add over its life beyond MAX_JUMP_STEPS: this share of its steps trained
D = TypeVar("D")


class Reply(Protocol):
    """What a gather reads of another replica's answer, however it travelled (over P2P:
    `swarm.p2p.messages.PayloadReply`)."""

    status: str  # "ok" with the payload; otherwise why not ("gone", "not yet", "wrong block", "not a member", ...)
    payload: bytes
    fingerprint: bytes  # what the sender applied last
    newest_step: int  # the newest step the sender keeps a payload of


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
        """The newest step that a strict majority of the replicas asked, and at least
        `MIN_REPORTERS` of them, report having reached (-1 when none is so reported)."""
        needed = max(MIN_REPORTERS, self.asked // 2 + 1)
        steps = sorted(self.reported_steps.values(), reverse=True)
        return steps[needed - 1] if len(steps) >= needed else -1

    def take(self, peer_id: str, reply: Reply) -> bool:
        """Keep what a reply says; True when that peer need not be asked again this step."""
        if reply.status == "ok":
            self.payloads[peer_id], self.fingerprints[peer_id] = reply.payload, reply.fingerprint
            return True
        self.reported_steps[peer_id] = max(self.reported_steps.get(peer_id, -1), reply.newest_step)
        return reply.status in ("gone", "wrong block", "not a member")


@dataclass
class Round:
    """One step's exchange in flight: what this replica published, and the gather of the others'."""

    step: int
    own: bytes
    fingerprint: bytes  # what this replica said it applied last, sent with `own`
    gathering: Future


class Transport(Protocol):
    """How an exchange's payloads travel: between peers over P2P (`swarm.sync.transport`), or
    between replicas in one process (`swarm.sync.in_process`, for benchmarks)."""

    deadline: float  # the most seconds a gather waits for the others' payloads of a step

    def served_bytes(self) -> tuple[int, int]:
        """Bytes this replica served the others and bytes of their requests, in all (its own
        requests and the replies it got are counted in each `Gathered`, but for those of an ask
        that went on past its gather, counted here)."""

    def publish(self, step: int, payload: bytes, fingerprint: bytes) -> None:
        """Make this replica's payload of `step` available to the others (before any gather of `step` starts)."""

    def gather(self, step: int, peer_ids: list[str]) -> Future:
        """Start gathering the payloads of `step` of `peer_ids` (a Future of `Gathered`; returns at once)."""

    def judged(self, decoded: list[str], refused: list[str]) -> None:
        """The payloads a gather brought were decoded: those of `refused` failed the strategy's
        checks (a transport that waits only for some replicas waits no more for these, until one of
        their payloads decodes: transport.py's `Punctuality`)."""

    def set_aside(self, uncounted: list[str], counted: list[str]) -> None:
        """The update was made without the decoded payloads of `uncounted` and with those of
        `counted` (a transport that waits only for some replicas waits less for those set aside
        again and again: transport.py's `Punctuality.set_aside`)."""


@dataclass
class Exchange:
    """One replica's side of the exchange: publish and gather a step, decode the set in order,
    notice drift, follow a majority that is ahead; and the figures a `SyncStrategy` reports."""

    transport: Transport
    own_id: str
    replica_ids: Callable[[], list[str]]  # peer ids of the other replicas of the block, now
    rounds: int = 0  # steps whose set held another replica's payload
    drifted: bool = False  # some replica applied other payloads than we did since the last averaging
    wait_seconds: float = 0.0  # how long the trainer waited for gathers, in all
    round_seconds: float | None = None  # how long the last gather took
    applied: bytes = b"started"  # fingerprint of the last set applied
    voters: frozenset[str] = frozenset()  # the other replicas whose payloads made the last update (reconcile.py)
    _missing: int = 0  # replicas whose payload the last gather went without
    trace: Callable[[dict], None] | None = None  # gets each publish and wait, with its monotonic time
    spare_batch: Callable[[], int] | None = None  # computes one spare batch for the trainer's next step; its windows
    witness: Witness | None = None  # counts the other replicas' payloads applied, for the ledger (swarm/p2p/ledger.py)
    jump_allowance: int = MAX_JUMP_STEPS  # what its jumps may take before it trained a step (`allowance_for`)
    trained_steps: int = 0  # steps this replica trained in the rounds it finished (the jump budget grows with them)
    jumped_steps: int = 0  # how far this replica's jumps moved its step, in all (the jump budget they spent)
    _request_bytes: int = 0
    _reply_bytes: int = 0

    @property
    def bytes_sent(self) -> int:
        return self.transport.served_bytes()[0] + self._request_bytes

    @property
    def bytes_received(self) -> int:
        return self.transport.served_bytes()[1] + self._reply_bytes

    def start(self, step: int, own: bytes) -> Round:
        """Publish this replica's payload of `step` and start gathering the others' (returns at once)."""
        if self.trace:
            self.trace({"event": "publish", "step": step, "t": time.monotonic()})
        self.transport.publish(step, own, self.applied)
        return Round(step, own, self.applied, self.transport.gather(step, self.replica_ids()))

    def collect(self, round_: Round) -> Gathered:
        """Wait for a round's gather (counted as waiting) and count its bytes. With a `spare_batch`
        callback, spare batches for the trainer's next step are computed until the gather is done,
        instead of waiting (the last batch may end a little after it)."""
        spare_from = time.monotonic()
        give_up_at = spare_from + self.transport.deadline + 2 * GATHER_GRACE_S  # spare batches and waiting together
        windows = self._spare_batches(round_, give_up_at)
        waited_from = time.monotonic()
        gathered: Gathered = round_.gathering.result(max(0.0, give_up_at - time.monotonic()))
        waited_to = time.monotonic()
        self.wait_seconds += waited_to - waited_from
        if self.trace:
            self.trace({"event": "wait", "step": round_.step, "seconds": waited_to - waited_from, "t": waited_to,
                        "spare_seconds": waited_from - spare_from if windows else 0.0,
                        "spare_windows": windows})  # fmt: skip
        self._count(round_, gathered)
        return gathered

    def _spare_batches(self, round_: Round, give_up_at: float) -> int:
        """Spare batches computed while the round's gather runs; the windows they took."""
        windows = 0
        while self.spare_batch is not None and not round_.gathering.done() and time.monotonic() < give_up_at:
            windows += self.spare_batch()
        return windows

    def _count(self, round_: Round, gathered: Gathered) -> None:
        """A gather's figures: its time, its bytes, and the replicas it went without (logged once per change)."""
        self.round_seconds = gathered.seconds
        self._request_bytes += gathered.bytes_sent
        self._reply_bytes += gathered.bytes_received
        missing = gathered.asked - len(gathered.payloads)
        if missing and missing != self._missing:  # once per change: a vanished replica stays listed for a while
            logger.warning("step %d: no payload from %d of the %d replicas asked in %.1fs (newest steps reported: %s)",
                           round_.step, missing, gathered.asked, gathered.seconds, gathered.reported_steps)  # fmt: skip
        self._missing = missing

    def finish(self, round_: Round, step: int, decode: Callable[[bytes], D],
               apply: Callable[[list[tuple[str, D]]], list[str]], round_steps: int = 1,
               how: str = "") -> int | None:  # fmt: skip
        """End a round, as every strategy that swaps payloads does: wait for its gather (`collect`),
        decode its set in peer-id order (`in_order`), `apply` it (the strategy's optimizer step; it
        returns the peer ids whose payloads made the update), record that set (`applied_set`), and
        return the step to continue from when a majority of the replicas is past the round of the
        trainer's `step` (`majority_ahead`), else None. `how`: what else decides the update besides
        the set (DeMo: its rate), in the fingerprint, so replicas that applied it differently notice.
        The transport learns whose decoded payloads the update left out (`Transport.set_aside`)."""
        gathered = self.collect(round_)
        decoded = self.in_order(round_, gathered, decode)
        counted = apply(decoded)
        self.applied_set(round_, counted, how)
        others = [peer_id for peer_id, _ in decoded if peer_id != self.own_id]
        self.transport.set_aside([p for p in others if p not in counted], [p for p in others if p in counted])
        return self.majority_ahead(gathered, step, round_steps)

    @contextmanager
    def between_steps(self) -> Iterator[None]:
        """Rounds finished in here (a strategy's `settle`, before a checkpoint) are waited for
        between steps, outside the trainer's compute: that lowers utilisation as wall time already,
        so it is not counted again in `wait_seconds`."""
        waited = self.wait_seconds
        try:
            yield
        finally:
            self.wait_seconds = waited

    def in_order(self, round_: Round, gathered: Gathered, decode: Callable[[bytes], D]) -> list[tuple[str, D]]:
        """Every payload of the round, own included, decoded in peer-id order, with its sender;
        refused ones are logged and left out."""
        decoded, refused = [], []
        for peer_id, data in sorted({**gathered.payloads, self.own_id: round_.own}.items()):
            try:
                decoded.append((peer_id, decode(data)))
            except PayloadError as error:
                logger.warning("refused the step %d payload of %s: %s", round_.step, peer_id, error)
                refused.append(peer_id)
        accepted = [peer_id for peer_id, _ in decoded]
        self.transport.judged([p for p in accepted if p != self.own_id], refused)
        self._notice_drift(round_, gathered, accepted)
        return decoded

    def _notice_drift(self, round_: Round, gathered: Gathered, accepted: list[str]) -> None:
        """Drifted if a replica whose payload was accepted applied another set than we did (the
        fingerprint of a refused payload says nothing: anyone can send one)."""
        theirs = [gathered.fingerprints[p] for p in accepted if p in gathered.fingerprints]
        if any(f != round_.fingerprint for f in theirs) and not self.drifted:
            logger.info(
                "step %d: another replica applied other payloads than we did: the next merge will reconcile them",
                round_.step,
            )
            self.drifted = True

    def applied_set(self, round_: Round, peer_ids: list[str], how: str = "") -> None:
        """The round's update was made of the payloads of `peer_ids` (and `how`, `finish`'s): this
        replica's fingerprint, and one more round exchanged if another replica's payload was among
        them; each of theirs
        is credited to its sender in the ledger."""
        self.applied = applied_fingerprint(round_.step, peer_ids, how)
        others = [peer_id for peer_id in peer_ids if peer_id != self.own_id]
        self.voters = frozenset(others)
        self.rounds += int(bool(others))
        if self.witness is not None:
            self.witness.accepted(others)

    def majority_ahead(self, gathered: Gathered, step: int, round_steps: int = 1) -> int | None:
        """The step to continue from, where a majority of the replicas asked is, if that is past the
        end of the round this replica's `step` is in (rounds of `round_steps` steps: an overlapped
        outer round is applied mid-round, when the others may well have ended the round this
        replica is still in) and within the jump budget (`jump_budget`, which the jump spends); None
        to go on as it is. Each call ends a round: `round_steps` steps this replica trained. The
        trainer lands the jump (`end_step`)."""
        self.trained_steps += round_steps
        ahead = gathered.majority_step()
        round_end = -(-(step + 1) // round_steps) * round_steps
        if ahead <= round_end:
            return None
        if ahead - step > (budget := self.jump_budget()):
            logger.warning("replicas report step %d, %d steps ahead of this one: more than its jumps may still take "
                           "(%d); staying", ahead, ahead - step, budget)  # fmt: skip
            return None
        self.jumped_steps += ahead - step
        logger.info("a majority of the replicas is at step %d: jumping from %d", ahead, step)
        return ahead

    def jump_budget(self) -> int:
        """How far this replica's step may still jump (module docstring): `MAX_JUMP_STEPS` at once, and over
        its life its `jump_allowance` plus `JUMP_SHARE` of the steps it trained, less what its jumps took."""
        earned = self.jump_allowance + int(JUMP_SHARE * self.trained_steps) - self.jumped_steps
        return max(0, min(MAX_JUMP_STEPS, earned))

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

    def settle(self, trainer: Trainer) -> int | None:
        return None


def allowance_for(schedule_steps: int) -> int:
    """What a replica's jumps may take before it trained a step (an `Exchange`'s `jump_allowance`):
    `JUMP_SHARE` of the steps its learning-rate schedule spans, at most `MAX_JUMP_STEPS`. A short run's
    schedule shifted 1000 steps is at its floor; shifted a tenth, it loses a tenth of its decay."""
    return min(MAX_JUMP_STEPS, int(JUMP_SHARE * schedule_steps))


def json_lines(path: str) -> Callable[[dict], None]:
    """A trace that appends each event to `path` as a JSON line (line-buffered, so each is on disk
    as it happens, and a peer killed mid-run leaves whole lines; the file closes at exit)."""
    out = open(path, "a", buffering=1)

    def write(event: dict) -> None:
        out.write(json.dumps(event) + "\n")

    return write


def applied_fingerprint(step: int, peer_ids: list[str], how: str = "") -> bytes:
    """8 bytes naming one step's update: equal for replicas that applied the same payloads the same `how`."""
    what = f"{step}:{','.join(sorted(peer_ids))}" + (f":{how}" if how else "")
    return hashlib.blake2b(what.encode(), digest_size=8).digest()
