"""Dense averaging with hivemind's DecentralizedAverager: `--sync dense`, the baseline.

Every step, the replicas of a block (an all-reduce among the replicas that find each other
on the DHT under a prefix without dots) average their full fp32 gradients, then each takes
its own AdamW step. This is the baseline every other mode is measured against.
`CountingAverager` counts the protobuf messages hivemind's all-reduce sends; the peer
reports that count.

hivemind's all-reduce trusts every groupmate: one picks its own weight, the part it reduces
comes back as whatever it sends, and it may announce a message of any length. So it serves
this baseline alone (swarm-peer's --help and the README say so); the rounds that bring
drifted replicas back together go through verified checkpoints and a robust median instead
(reconcile.py).

A replica that cannot find its group within the timeout keeps its own gradients for that
step: nobody waits longer than the timeout for a slow or dead replica.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import AsyncIterator, Sequence

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import as_aiter, azip

from swarm.model.train import Trainer, trainable

logger = logging.getLogger(__name__)


class _CountingRunner(AllReduceRunner):
    """hivemind's all-reduce, counting the bytes of every tensor message this replica sends."""

    def __init__(self, bytes_sent: mp.Value, **kwargs):
        super().__init__(**kwargs)
        self._bytes_sent = bytes_sent

    def _count(self, message: averaging_pb2.AveragingData) -> averaging_pb2.AveragingData:
        with self._bytes_sent.get_lock():
            self._bytes_sent.value += message.ByteSize()
        return message

    async def _generate_input_for_peer(self, peer_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        async for message in super()._generate_input_for_peer(peer_index):  # our parts, to their reducers
            yield self._count(message)

    async def _accumulate_parts_streaming(
        self, stream, sender_index: int
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        async for message in super()._accumulate_parts_streaming(stream, sender_index):  # averages, sent back
            yield self._count(message)


class CountingAverager(DecentralizedAverager):
    """A DecentralizedAverager whose all-reduce counts the bytes it sends (`bytes_sent`, shared
    with the process that owns it: the averager itself runs in a child process)."""

    def __init__(self, averaged_tensors: Sequence[torch.Tensor], dht: DHT, **kwargs):
        self.shared_bytes_sent = mp.Value("Q", 0)  # set before the child process starts
        super().__init__(averaged_tensors, dht, start=True, **kwargs)

    @property
    def bytes_sent(self) -> int:
        return self.shared_bytes_sent.value

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
        """hivemind's own method, with the counting runner (every replica here is a full peer)."""
        group_id = group_info.group_id if group_id is None else group_id
        runner = _CountingRunner(
            self.shared_bytes_sent, p2p=self._p2p, servicer_type=type(self), prefix=self.prefix,
            tensors=tensors, group_id=group_id, ordered_peer_ids=group_info.peer_ids, **kwargs,
        )  # fmt: skip
        self._running_groups[group_id].set_result(runner)
        async for tensor, update in azip(as_aiter(*tensors), runner):
            tensor.add_(update, alpha=self._averaging_alpha)


def block_averager(
    dht: DHT, prefix: str, tensors: Sequence[torch.Tensor], group_size: int, matchmaking_time: float
) -> CountingAverager:
    """An averager for one block's replicas, grouping up to `group_size` of them. It holds float32
    copies on the CPU, whatever the block's device and dtype: the dense fp32 exchange, the baseline."""
    host_copies = [t.detach().to("cpu", torch.float32, copy=True) for t in tensors]
    return CountingAverager(
        host_copies, dht, prefix=prefix, target_group_size=group_size,
        min_group_size=2, min_matchmaking_time=matchmaking_time, request_timeout=matchmaking_time / 2,
        allreduce_timeout=10 * matchmaking_time + 30, next_chunk_timeout=matchmaking_time + 10,
    )  # fmt: skip


def average(
    averager: CountingAverager, tensors: Sequence[torch.Tensor], what: str, timeout: float
) -> list[torch.Tensor] | None:
    """The group's average of `tensors` ("grads" or "params"), or None when no group formed
    within `timeout` or a groupmate averaged something else in the same round."""
    with torch.no_grad(), averager.get_tensors() as shared:
        for target, source in zip(shared, tensors):
            target.copy_(source.detach())
    try:
        group = averager.step(gather=what, timeout=timeout, allow_retries=False)
    except Exception as error:  # a groupmate vanished mid all-reduce
        logger.info("averaging %s failed: %s", what, error)
        return None
    if not group:
        return None
    if any(theirs != what for theirs in group.values()):
        logger.info("averaging %s: a groupmate averaged something else in this round; result dropped", what)
        return None
    with averager.get_tensors() as shared:
        return [t.clone() for t in shared]


class DenseSync:
    """`--sync dense` (a `SyncStrategy`): average the full gradients, then step AdamW."""

    # all of it goes through the averager, whose bytes the peer counts;
    # hivemind's all-reduce does not tell what it receives: about what it sends
    bytes_sent = bytes_received = 0

    def __init__(self, module: torch.nn.Module, averager: CountingAverager, timeout: float):
        self.averager, self.timeout = averager, timeout
        self.params = trainable(module)
        self.steps = 0  # steps averaged with at least one other replica
        self.round_seconds: float | None = None  # how long the last averaging round took
        self.wait_seconds = 0.0  # the trainer waits for every round

    def may_have_drifted(self) -> bool:
        return True  # averaged gradients differ in rounding between replicas, and a round may fail

    def averaged(self, step: int) -> None:
        pass

    def settle(self, trainer: Trainer) -> int | None:
        return None

    def update(self, trainer: Trainer) -> int | None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        started = time.monotonic()
        averaged = average(self.averager, grads, "grads", self.timeout)
        self.round_seconds = time.monotonic() - started
        self.wait_seconds += self.round_seconds
        if averaged is not None and not all(torch.isfinite(g).all() for g in averaged):
            logger.warning("the group's averaged gradients hold a value that is not finite: own gradients kept")
            averaged = None
        if averaged is not None:
            self.steps += 1
            for param, grad in zip(self.params, averaged):
                param.grad = grad.to(param)  # from the averager's CPU float32 to the block's device and dtype
        trainer.optimizer_step()
        return None
