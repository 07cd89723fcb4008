"""A replica's payload service against polls for steps that strangers make up; whose steps a replica follows."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from hivemind.proto import runtime_pb2
from swarm_helpers import wait_for

from swarm.lab.hosting import InProcessNode
from swarm.model.denoiser import build_block
from swarm.p2p.messages import PayloadReply, PayloadRequest
from swarm.sync.compression import PayloadError
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer, encode_payload
from swarm.sync.exchange import (
    JUMP_SHARE,
    MAX_JUMP_STEPS,
    Exchange,
    Gathered,
    Round,
    allowance_for,
    applied_fingerprint,
)
from swarm.sync.lockstep import DeMoSync
from swarm.sync.transport import KEEP_PAYLOADS, PENDING_STEPS, PayloadServicer, Punctuality, gather


def poll(servicer: PayloadServicer, step: int) -> str:
    request = runtime_pb2.ExpertRequest(metadata=PayloadRequest(block=0, step=step).encode())
    return servicer._payload(request)


def test_polls_for_made_up_future_steps_leave_nothing_behind_and_honest_polls_still_wait():
    async def scenario() -> tuple[list[str], int, int, PayloadReply]:
        servicer = PayloadServicer(block=0, deadline=0.2)
        replies = asyncio.gather(*(poll(servicer, 10**9 + i) for i in range(10 * PENDING_STEPS)))
        await asyncio.sleep(0.05)
        held_while_waiting = len(servicer._published)
        statuses = [r.status for r in await replies]
        honest = asyncio.ensure_future(poll(servicer, 3))
        await asyncio.sleep(0.05)
        servicer.publish(3, b"payload", b"fingerprint")
        return statuses, held_while_waiting, len(servicer._published), await honest

    statuses, held_while_waiting, held_after, honest = asyncio.run(scenario())
    assert statuses == ["not yet"] * (10 * PENDING_STEPS)
    assert held_while_waiting <= PENDING_STEPS
    assert held_after == 1  # the published step's alone
    assert honest.status == "ok" and honest.payload == b"payload"


def test_polls_for_made_up_future_steps_take_no_place_from_a_poll_for_the_next_step():
    """Strangers with free peer ids long-poll more made-up future steps than may wait at once: a
    replica a step ahead still waits for this one's next payload and gets it when it is published.
    Without places kept for steps near this replica's own, it got "not yet" at once, and asked again."""

    async def scenario() -> tuple[PayloadReply, list[PayloadReply]]:
        servicer = PayloadServicer(block=0, deadline=0.5)
        servicer.publish(3, b"three", b"fingerprint")
        flood = asyncio.gather(*(poll(servicer, 10**9 + i) for i in range(2 * PENDING_STEPS)))
        await asyncio.sleep(0.05)
        honest = asyncio.ensure_future(poll(servicer, 4))
        await asyncio.sleep(0.05)
        servicer.publish(4, b"four", b"fingerprint")
        return await honest, await flood

    honest, flood = asyncio.run(scenario())
    assert honest.status == "ok" and honest.payload == b"four"
    assert [reply.status for reply in flood] == ["not yet"] * (2 * PENDING_STEPS)


@pytest.mark.parametrize("majority_at, round_steps, jumps_to", [(60, 1, 60), (60, 30, None), (90, 30, 90)])
def test_a_replica_jumps_only_past_the_end_of_the_round_it_is_in(majority_at, round_steps, jumps_to):
    """DeMo (rounds of one step) follows a majority that is ahead at once; an overlapped outer
    replica, two steps into the round that ends at 60, does not jump to the others' 60 (they
    ended the round it is still in), only to a round past it."""
    exchange = Exchange(transport=None, own_id="me", replica_ids=list)
    gathered = Gathered(asked=3, reported_steps={"a": majority_at, "b": majority_at, "c": majority_at})
    assert exchange.majority_ahead(gathered, 32, round_steps) == jumps_to  # the step to continue from, or None


@pytest.mark.parametrize("asked", [1, 2])
def test_one_voice_never_makes_a_replica_jump(asked):
    """The only other replica, or one of two (the other silent), reporting a step ahead: nobody jumps."""
    exchange = Exchange(transport=None, own_id="me", replica_ids=list)
    assert exchange.majority_ahead(Gathered(asked=asked, reported_steps={"a": 60}), 32) is None


def test_a_jump_is_bounded_even_when_a_majority_reports_it():
    exchange = Exchange(transport=None, own_id="me", replica_ids=list)
    far = {"a": 10**12, "b": 10**12, "c": 10**12}
    assert exchange.majority_ahead(Gathered(asked=3, reported_steps=far), 32) is None


def trained_beside(exchange: Exchange, steps: int, claims: Callable[[int], int | None], step: int = 0) -> int:
    """A lone replica's step after it trained `steps` steps from `step` (one round each), asking two
    keys that report `claims(step)` for every step it asks (None: they have the step asked)."""
    for _ in range(steps):
        claimed = claims(step)
        reported = {} if claimed is None else {"a": claimed, "b": claimed}
        jump = exchange.majority_ahead(Gathered(asked=2, reported_steps=reported), step)
        step = step + 1 if jump is None else jump
    return step


@pytest.mark.parametrize("schedule", [100_000, 150])
@pytest.mark.parametrize("ahead", [2, 11, MAX_JUMP_STEPS])
def test_keys_that_report_a_step_ahead_on_every_step_move_a_replica_within_its_jump_budget(ahead, schedule):
    """Two free keys answer every poll with "gone, the newest step is the one asked plus `ahead`": by
    1000 (issue 57: every step a jump, the rate at its floor within about 100 steps), or by a few
    steps, which a budget of single jumps would let through every time. Over its whole life the
    replica's step moves at most its allowance (a tenth of its schedule, 1000 at most) plus
    `JUMP_SHARE` of the steps it trained; with the budget gone (one jump's bound alone), 1200 steps
    would move it 1200 jumps. A short run's schedule (150 steps) is shifted 15 steps, not 1000."""
    exchange = Exchange(transport=None, own_id="me", replica_ids=list, jump_allowance=allowance_for(schedule))
    trained = 1200
    step = trained_beside(exchange, trained, lambda asked: asked + ahead)
    assert step - trained <= exchange.jumped_steps <= allowance_for(schedule) + JUMP_SHARE * trained
    assert (step > trained) == (ahead <= allowance_for(schedule))  # a late joiner's one jump is still taken


def test_a_joiner_that_spent_its_budget_rejoins_from_what_its_training_earned():
    """A late joiner enters at the others' step at once; one that later falls behind again (a pause)
    rejoins once the steps it trained since earn the jump back, never before."""
    exchange = Exchange(transport=None, own_id="me", replica_ids=list)
    assert trained_beside(exchange, 1, lambda asked: asked + MAX_JUMP_STEPS) == MAX_JUMP_STEPS  # the joiner's entry
    step = trained_beside(exchange, 100, lambda asked: None, step=MAX_JUMP_STEPS)  # in step: nobody reports
    assert trained_beside(exchange, 1, lambda asked: asked + 50, step=step) == step + 1  # 10 steps earned: not yet
    step = trained_beside(exchange, 400, lambda asked: None, step=step + 1)
    assert trained_beside(exchange, 1, lambda asked: asked + 50, step=step) == step + 50  # 50 earned: rejoined


def test_a_refused_payload_says_nothing_about_drift():
    """A stranger whose payload is refused cannot mark the replicas as drifted with its fingerprint;
    the transport hears which payloads were refused (and waits no more for their senders)."""
    judged = []
    exchange = Exchange(transport=SimpleNamespace(judged=lambda *both: judged.append(both)), own_id="me",
                        replica_ids=list)  # fmt: skip
    round_ = Round(step=5, own=b"mine", fingerprint=b"same", gathering=None)
    gathered = Gathered(asked=2, payloads={"honest": b"ok", "liar": b"bad"},
                        fingerprints={"honest": b"same", "liar": b"other"})  # fmt: skip

    def decode(data: bytes) -> bytes:
        if data == b"bad":
            raise PayloadError("does not fit")
        return data

    assert [p for p, _ in exchange.in_order(round_, gathered, decode)] == ["honest", "me"]
    assert not exchange.drifted and judged == [(["honest"], ["liar"])]
    gathered.payloads["liar"] = b"fits now"
    exchange.in_order(round_, gathered, decode)
    assert exchange.drifted  # an accepted payload's fingerprint counts


def test_finishing_a_round_applies_its_set_in_order_records_it_and_follows_a_majority():
    """`Exchange.finish`, how every strategy that swaps payloads ends a round: the set decoded in
    peer-id order (own included), applied, recorded as applied, and a majority ahead followed."""
    gathering = Future()
    gathering.set_result(Gathered(asked=3, payloads={"b": b"2", "a": b"1"}, reported_steps={"c": 60, "d": 60}))
    set_aside = []
    transport = SimpleNamespace(deadline=1.0, judged=lambda *_: None, set_aside=lambda *both: set_aside.append(both))
    exchange = Exchange(transport=transport, own_id="me", replica_ids=list)
    seen = []

    def apply(decoded: list[tuple[str, str]]) -> list[str]:
        seen.append(decoded)
        return ["a", "me"]  # the senders whose payloads made the update

    round_ = Round(step=5, own=b"0", fingerprint=b"started", gathering=gathering)
    assert exchange.finish(round_, 5, bytes.decode, apply) == 60
    assert seen == [[("a", "1"), ("b", "2"), ("me", "0")]]
    assert exchange.applied == applied_fingerprint(5, ["a", "me"]) and exchange.rounds == 1
    assert set_aside == [(["b"], ["a"])]  # the transport hears whose decoded payload the update left out


def test_a_round_finished_between_steps_is_not_counted_as_waiting():
    exchange = Exchange(transport=None, own_id="me", replica_ids=list, wait_seconds=2.0)
    with exchange.between_steps():
        exchange.wait_seconds += 5.0  # what collect adds
    assert exchange.wait_seconds == 2.0


def test_demo_replicas_that_step_the_same_set_at_different_rates_fingerprint_it_differently(tiny_config):
    """DeMo's rate follows each trainer's schedule (another --max-steps, another rate): the rate
    is in the fingerprint of what a replica applied, so two that stepped the same set differently
    notice the drift. With the rate left out of the fingerprint, both would read the same."""
    applied = []
    for lr in (2e-3, 1e-3):  # the same step of two schedules: the peak, and halfway down
        optimizer = DeMoOptimizer(build_block(tiny_config, 0), DeMoConfig(), lr=2e-3)
        own = encode_payload(optimizer.make_payload(lr), 16)  # no gradients yet: no parameter, a valid payload
        gathering = Future()
        gathering.set_result(Gathered(asked=1))
        transport = SimpleNamespace(deadline=1.0, judged=lambda *_: None, set_aside=lambda *_: None)
        exchange = Exchange(transport=transport, own_id="me", replica_ids=list)
        sync = DeMoSync(optimizer, exchange)
        sync.apply(Round(step=5, own=own, fingerprint=b"started", gathering=gathering), 5)
        applied.append(exchange.applied)
    assert applied[0] != applied[1]


def test_a_sender_set_aside_again_and_again_is_waited_for_less_and_less_and_at_once_when_it_counts():
    """Issue 57: free keys whose payloads decode, and that the vote sets aside every step (a payload
    that decodes to nothing, its own negated), were punctual, so every gather waited for them in
    full. A sender set aside n times in a row is not waited for in the next 2^n gathers; one whose
    payload counts is waited for again at once (an honest replica the others contradicted a while)."""
    punctuality, ask, waited = Punctuality(), SimpleNamespace(done=lambda: True), []  # an ask that has ended
    for _ in range(16):
        in_full = punctuality.waited_in_full(["key", "honest"])
        waited.append("key" in in_full)
        payloads = {"honest": b"y", **({"key": b"x"} if "key" in in_full else {})}  # else it comes after the gather
        punctuality.ended(Gathered(asked=2, payloads=payloads), {"key": ask, "honest": ask}, {})
        punctuality.punctual.add("key")  # its ask went on and brought its payload in time (`_trailed`)
        punctuality.set_aside(["key"] if "key" in payloads else [], ["honest"])
    assert waited == [True, False, False, True, False, False, False, False, True] + [False] * 7, waited
    punctuality.set_aside([], ["key"])
    assert punctuality.waited_in_full(["key", "honest"]) == ["key", "honest"]


@pytest.fixture
def two_nodes():
    """Two DHT nodes on 127.0.0.1, each with a P2P handle: one gathers, the other serves payloads."""
    with InProcessNode("polls") as asker, InProcessNode("polls", asker.maddrs) as server:
        yield asker, server


def test_a_replica_that_missed_a_round_is_waited_for_in_full_again_once_a_payload_of_it_comes_in_time(two_nodes):
    """A replica that missed its last round (it was saving a checkpoint, say) and publishes each payload
    half a deadline after it is asked: the gather ends at once, without it, but the ask goes on out of
    the trainer's way and its payload, in within the deadline, makes it punctual again, so the next
    gather waits for it and takes its payload. Judged only by what came while the gather was open, it
    would be left out of every step; and were its ask not kept (the event loop holds a task only
    weakly), the ask could be collected mid-flight and its replica never waited for again."""
    asker, server = two_nodes
    deadline = 2.0
    served = PayloadServicer(0, deadline)
    server.serve(served)
    punctuality = Punctuality()
    punctuality.met = True  # a first gather has ended, and this replica's payload did not come in it

    async def publish_late(step: int) -> None:
        await asyncio.sleep(deadline / 2)
        served.publish(step, f"payload {step}".encode(), b"fingerprint")

    def gathered(step: int) -> Gathered:
        server.loop.submit(publish_late(step))
        return asker.loop.run(gather(asker.p2p, 0, step, [server.peer_id], deadline, punctuality), 2 * deadline)

    first = gathered(1)
    assert not first.payloads and first.seconds < deadline / 4
    gc.collect()  # the ask past the gather is held by no one but `punctuality`: collected, it would never end
    wait_for(lambda: server.peer_id in punctuality.punctual, deadline, "the ask past the gather to bring step 1")
    assert punctuality.bytes_received > len(b"payload 1")  # the bytes of that ask are counted too
    second = gathered(2)
    assert second.payloads == {server.peer_id: b"payload 2"} and second.seconds >= deadline / 2


def test_a_replica_whose_payload_was_refused_is_not_made_punctual_again_by_payloads_never_judged(two_nodes):
    """A key whose payload came in time but was refused when decoded (junk bytes just before each
    deadline, issue 57) is waited for no more: its asks go on past each gather, and a payload they
    bring in time is never decoded, so it must not make the key punctual again, or every other
    gather would wait for its junk to the deadline. Its payload decoding again takes it back."""
    asker, server = two_nodes
    deadline = 2.0
    served = PayloadServicer(0, deadline)
    server.serve(served)
    punctuality = Punctuality()
    punctuality.met = True  # a first gather has ended, and brought the key's junk in time
    punctuality.punctual.add(server.peer_id)
    punctuality.judged([], [server.peer_id])  # the exchange refused it when decoding (`Transport.judged`)

    async def publish_late(step: int) -> None:
        await asyncio.sleep(deadline / 2)
        served.publish(step, b"junk", b"fingerprint")

    def gathered(step: int) -> Gathered:
        server.loop.submit(publish_late(step))
        return asker.loop.run(gather(asker.p2p, 0, step, [server.peer_id], deadline, punctuality), 2 * deadline)

    first = gathered(1)
    assert not first.payloads and first.seconds < deadline / 4  # not waited for
    wait_for(lambda: server.peer_id not in punctuality.trailing, 2 * deadline, "the ask past the gather to end")
    assert punctuality.bytes_received > len(b"junk")  # it brought the payload in time
    assert server.peer_id not in punctuality.punctual
    punctuality.judged([server.peer_id], [])  # a payload of it decoded (one that came while a gather was open)
    assert server.peer_id not in punctuality.refused  # the next gather whose payload of it comes is its own again


def test_a_replica_that_answered_gone_is_not_asked_again_until_its_payloads_could_be_there(two_nodes):
    """A replica that keeps the payloads of steps 100 to 107 answers a poll for step 90 "gone, the
    newest is 107": it keeps nothing older than its newest `KEEP_PAYLOADS`, now or later, so no poll
    reaches it for steps 91 to 99 (its answer stands in each gather: free keys claiming a step far
    ahead were asked, and answered at once, every step: issue 57's jump rows), and step 100 is asked
    for again and its payload comes. Without that memory each of those gathers asks it."""
    asker, server = two_nodes
    served = PayloadServicer(0, 2.0)
    server.serve(served)
    oldest, newest = 100, 100 + KEEP_PAYLOADS - 1

    async def publish() -> None:
        for step in range(oldest, newest + 1):
            served.publish(step, f"payload {step}".encode(), b"fingerprint")

    server.loop.run(publish(), 5.0)
    punctuality = Punctuality()

    def gathered(step: int) -> Gathered:
        return asker.loop.run(gather(asker.p2p, 0, step, [server.peer_id], 2.0, punctuality), 5.0)

    assert gathered(90).reported_steps == {server.peer_id: newest}
    polls = served.bytes_received
    for step in range(91, oldest):
        skipped = gathered(step)
        assert skipped.reported_steps == {server.peer_id: newest} and not skipped.payloads
    assert served.bytes_received == polls, "a replica known to keep no payload of those steps was polled"
    gathered(oldest)  # not waited for (its last answer was no payload): its ask goes on past the gather
    wait_for(lambda: server.peer_id in punctuality.punctual, 5.0, "the poll for step 100 to bring its payload")


def test_a_record_that_names_no_peer_id_is_left_out_of_a_gather(two_nodes):
    """A record may name any string as its peer id: that replica is left out; the gather neither fails
    (which failed the trainer's step) nor waits for it."""
    asker, _ = two_nodes
    gathered = asker.loop.run(gather(asker.p2p, 0, 1, ["not a peer id!"], 5.0), 10.0)
    assert gathered.asked == 1 and not gathered.payloads and gathered.seconds < 1.0
