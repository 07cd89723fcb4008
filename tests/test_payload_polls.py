"""A replica's payload service against polls for steps that strangers make up; whose steps a replica follows."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from hivemind.proto import runtime_pb2

from swarm.model.denoiser import build_block
from swarm.p2p.messages import PayloadReply, PayloadRequest
from swarm.sync.compression import PayloadError
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer, encode_payload
from swarm.sync.exchange import Exchange, Gathered, Round, applied_fingerprint
from swarm.sync.lockstep import DeMoSync
from swarm.sync.transport import PENDING_STEPS, PayloadServicer


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


def test_a_refused_payload_says_nothing_about_drift():
    """A stranger whose payload is refused cannot mark the replicas as drifted with its fingerprint."""
    exchange = Exchange(transport=None, own_id="me", replica_ids=list)
    round_ = Round(step=5, own=b"mine", fingerprint=b"same", gathering=None)
    gathered = Gathered(asked=2, payloads={"honest": b"ok", "liar": b"bad"},
                        fingerprints={"honest": b"same", "liar": b"other"})  # fmt: skip

    def decode(data: bytes) -> bytes:
        if data == b"bad":
            raise PayloadError("does not fit")
        return data

    assert [p for p, _ in exchange.in_order(round_, gathered, decode)] == ["honest", "me"]
    assert not exchange.drifted
    gathered.payloads["liar"] = b"fits now"
    exchange.in_order(round_, gathered, decode)
    assert exchange.drifted  # an accepted payload's fingerprint counts


def test_finishing_a_round_applies_its_set_in_order_records_it_and_follows_a_majority():
    """`Exchange.finish`, how every strategy that swaps payloads ends a round: the set decoded in
    peer-id order (own included), applied, recorded as applied, and a majority ahead followed."""
    gathering = Future()
    gathering.set_result(Gathered(asked=3, payloads={"b": b"2", "a": b"1"}, reported_steps={"c": 60, "d": 60}))
    exchange = Exchange(transport=SimpleNamespace(deadline=1.0), own_id="me", replica_ids=list)
    seen = []

    def apply(decoded: list[tuple[str, str]]) -> list[str]:
        seen.append(decoded)
        return ["a", "me"]  # the senders whose payloads made the update

    round_ = Round(step=5, own=b"0", fingerprint=b"started", gathering=gathering)
    assert exchange.finish(round_, 5, bytes.decode, apply) == 60
    assert seen == [[("a", "1"), ("b", "2"), ("me", "0")]]
    assert exchange.applied == applied_fingerprint(5, ["a", "me"]) and exchange.rounds == 1


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
        exchange = Exchange(transport=SimpleNamespace(deadline=1.0), own_id="me", replica_ids=list)
        sync = DeMoSync(optimizer, exchange)
        sync.apply(Round(step=5, own=own, fingerprint=b"started", gathering=gathering), 5)
        applied.append(exchange.applied)
    assert applied[0] != applied[1]
