"""Limits every P2P service applies to each caller, so one peer cannot take a service from the rest.

Before anything else a service asks its `CallerGate` whether the caller may be served at all:
`OPEN` in an open swarm, a `MemberGate` (gate.py) in a members-only one.

A service admits at most `per_peer` requests from one peer at a time; more are refused at
once with a short "busy" error instead of queueing (a flood costs the flooder, not the
honest callers behind it). Requests larger than a service's byte limit are refused before
they are deserialized.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from hivemind.p2p import P2PContext, PeerID

# the largest legitimate denoise request of the default model (64 windows) is ~2.1 MiB; hivemind's
# own unary limit is 4 MiB (its daemon refuses more), so this refuses what gets past that
MAX_REQUEST_BYTES = 3 * 1024**2


class CallerGate(Protocol):
    """Who a service answers at all."""

    async def admits(self, peer_id: PeerID) -> bool: ...


class OpenGate:
    """Every caller: an open swarm's services (and those of the lab's nodes and tests)."""

    async def admits(self, peer_id: PeerID) -> bool:
        return True


OPEN = OpenGate()
NOT_A_MEMBER = "refused: this swarm is members-only and the caller proved no valid member certificate"


class Busy(Exception):
    """The caller already has as many requests in flight here as it may."""


class PerPeerLimit:
    """Counts the requests each caller has in flight at one service."""

    def __init__(self, per_peer: int):
        self.per_peer = per_peer
        self.in_flight: Counter = Counter()

    @contextlib.contextmanager
    def admit(self, context: P2PContext) -> Iterator[None]:
        caller = context.remote_id
        if self.in_flight[caller] >= self.per_peer:
            raise Busy(f"busy: at most {self.per_peer} requests at once per peer")
        self.in_flight[caller] += 1
        try:
            yield
        finally:
            self.in_flight[caller] -= 1
            if not self.in_flight[caller]:
                del self.in_flight[caller]
