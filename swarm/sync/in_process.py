"""Replicas of a block in one process, exchanging payloads with no network (benchmarks/sync_gap.py).

`LocalBoard` is what the replicas share: each publishes its payload of a step on it, and a
gather of a step is done once every replica asked has published that step, or once the
deadline has passed (those that have not are left out, as over P2P, and report the newest step
they published). `board.transport(peer_id)` is one replica's `Transport` for its `Exchange`,
so that the strategies run as they do in a peer. Bytes count payloads alone, one copy per
replica that took it (sent by its publisher, received by the taker): no request or reply
framing, which over P2P adds a few dozen bytes a message.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field

from swarm.sync.exchange import Gathered

KEEP_STEPS = 8  # steps of payloads kept on the board, for a replica a little behind the others


@dataclass
class _Waiting:
    """A gather in flight: the step, the replicas asked, its result to come, and its deadline's timer."""

    step: int
    peer_ids: list[str]
    result: Future
    started: float = field(default_factory=time.monotonic)
    timer: threading.Timer | None = None


class LocalBoard:
    """Payloads published by replicas in this process, and the gathers waiting for them."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.sent: dict[str, int] = defaultdict(int)  # by publisher: bytes of its payloads that others took
        self._lock = threading.Lock()
        self._published: dict[int, dict[str, tuple[bytes, bytes]]] = {}  # step: peer id: (payload, fingerprint)
        self._waiting: list[_Waiting] = []

    def transport(self, peer_id: str) -> LocalTransport:
        return LocalTransport(self, peer_id)

    def publish(self, peer_id: str, step: int, payload: bytes, fingerprint: bytes) -> None:
        with self._lock:
            self._published.setdefault(step, {})[peer_id] = payload, fingerprint
            for old in sorted(self._published)[:-KEEP_STEPS]:
                del self._published[old]
            for waiting in [w for w in self._waiting if self._complete(w)]:
                self._resolve(waiting)

    def gather(self, step: int, peer_ids: list[str]) -> Future:
        waiting = _Waiting(step, list(peer_ids), Future())
        with self._lock:
            if self._complete(waiting):
                self._resolve(waiting)
                return waiting.result
            self._waiting.append(waiting)
            waiting.timer = threading.Timer(self.deadline, self._give_up, (waiting,))
        waiting.timer.daemon = True
        waiting.timer.start()
        return waiting.result

    def _complete(self, waiting: _Waiting) -> bool:
        return all(p in self._published.get(waiting.step, {}) for p in waiting.peer_ids)

    def _give_up(self, waiting: _Waiting) -> None:
        with self._lock:
            if not waiting.result.done():
                self._resolve(waiting)

    def _resolve(self, waiting: _Waiting) -> None:
        """Hand a gather what is published now (under the lock)."""
        if waiting in self._waiting:
            self._waiting.remove(waiting)
        if waiting.timer is not None:
            waiting.timer.cancel()
        gathered = Gathered(asked=len(waiting.peer_ids))
        for peer_id in waiting.peer_ids:
            if (found := self._published.get(waiting.step, {}).get(peer_id)) is None:
                steps = [s for s, payloads in self._published.items() if peer_id in payloads]
                gathered.reported_steps[peer_id] = max(steps, default=-1)
                continue
            gathered.payloads[peer_id], gathered.fingerprints[peer_id] = found
            gathered.bytes_received += len(found[0])
            self.sent[peer_id] += len(found[0])
        gathered.seconds = time.monotonic() - waiting.started
        waiting.result.set_result(gathered)


class LocalTransport:
    """One replica's `Transport` over a `LocalBoard`."""

    def __init__(self, board: LocalBoard, peer_id: str):
        self.board, self.peer_id = board, peer_id
        self.deadline = board.deadline

    def served_bytes(self) -> tuple[int, int]:
        return self.board.sent[self.peer_id], 0  # its payloads others took; nobody sends it requests

    def publish(self, step: int, payload: bytes, fingerprint: bytes) -> None:
        self.board.publish(self.peer_id, step, payload, fingerprint)

    def gather(self, step: int, peer_ids: list[str]) -> Future:
        return self.board.gather(step, peer_ids)

    def judged(self, decoded: list[str], refused: list[str]) -> None:
        """Nothing: the board waits for every replica of a step up to the deadline."""

    def set_aside(self, uncounted: list[str], counted: list[str]) -> None:
        """Nothing, as `judged`."""
