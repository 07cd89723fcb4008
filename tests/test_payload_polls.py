"""A replica's payload service against polls for steps that strangers make up."""

from __future__ import annotations

import asyncio

from hivemind.proto import runtime_pb2

from swarm.p2p.messages import PayloadReply, PayloadRequest
from swarm.sync.exchange import PENDING_STEPS, PayloadServicer


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
