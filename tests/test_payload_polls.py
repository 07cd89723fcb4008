"""A replica's payload service against polls for steps that strangers make up; whose steps a replica follows."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hivemind.proto import runtime_pb2

from swarm.p2p.messages import PayloadReply, PayloadRequest
from swarm.sync.exchange import PENDING_STEPS, Exchange, Gathered, PayloadServicer


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
    exchange = Exchange(servicer=None, p2p=None, loop=None, own_id="me", replica_ids=list)
    trainer = SimpleNamespace(step_count=32)
    gathered = Gathered(asked=3, reported_steps={"a": majority_at, "b": majority_at, "c": majority_at})
    jumped = exchange.follow_majority(gathered, trainer, round_steps)
    assert jumped == (jumps_to is not None)
    assert trainer.step_count == (jumps_to - 1 if jumps_to else 32)  # the trainer adds the one
