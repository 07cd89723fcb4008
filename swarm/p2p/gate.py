"""Which callers a peer's services answer in a members-only swarm: those that prove a valid certificate.

A caller's request says nothing about who it is beyond its peer id, which libp2p authenticates.
So a service's `MemberGate` asks the caller's own `rpc_info` (info.py) for its `MemberProof`:
the answer comes from the peer that holds that id, and the proof is good only if the certified
key signed that very id (members.py). Clients of the swarm (swarm-fetch, swarm-generate, the
health page) answer `rpc_info` too, with their member's proof (client.py).

Asking costs a round trip, so each caller's answer is kept a while (`RECHECK_S`; a refusal, or a
caller that did not answer, for `REFUSED_S`, so that a member whose answer was lost is not shut
out long); expiry and revocation are checked again at every call, from the kept proof, without
asking. Callers asking at once share one question; at most `MAX_CALLERS` answers are kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from hivemind.p2p import P2P, PeerID

from swarm.p2p.info import ask_info
from swarm.p2p.members import Membership
from swarm.p2p.messages import PeerInfo

logger = logging.getLogger(__name__)

ASK_TIMEOUT_S = 5.0
RECHECK_S = 300.0  # a member's proof is asked again after this long
REFUSED_S = 10.0  # a caller refused (or silent) is asked again after this long
MAX_CALLERS = 4096


class MemberGate:
    """A `CallerGate` (limits.py): every caller in an open swarm, members only in a members-only one.

    Args:
        membership: the swarm's terms and revocations, shared with its directory (kept current there).
        ask: the caller's rpc_info answer (a test hands a fake; the peer, `ask_info` on its P2P handle).
    """

    def __init__(self, membership: Membership, ask: Callable[[PeerID], Awaitable[PeerInfo]]):
        self.membership, self.ask = membership, ask
        self._answers: OrderedDict[PeerID, tuple[float, PeerInfo | None]] = OrderedDict()  # asked at, answer
        self._asking: dict[PeerID, asyncio.Task] = {}
        self._refusals_logged: set[PeerID] = set()

    @classmethod
    def over(cls, membership: Membership, p2p: P2P) -> MemberGate:
        """The gate of a process whose P2P handle is `p2p`."""
        return cls(membership, lambda peer_id: ask_info(p2p, peer_id.to_base58(), ASK_TIMEOUT_S))

    async def admits(self, peer_id: PeerID) -> bool:
        if not self.membership.members_only:
            return True
        info = await self._answer(peer_id)
        refused = self.membership.refusal(info.membership if info else None, peer_id.to_base58())
        if refused and peer_id not in self._refusals_logged and len(self._refusals_logged) < MAX_CALLERS:
            self._refusals_logged.add(peer_id)
            logger.info("refusing peer %s: %s", peer_id, refused)
        return refused is None

    async def _answer(self, peer_id: PeerID) -> PeerInfo | None:
        """The caller's rpc_info answer, as kept or asked now (None if it did not answer)."""
        kept = self._answers.get(peer_id)
        if kept is not None:
            asked_at, info = kept
            if time.monotonic() - asked_at < (RECHECK_S if info is not None and info.membership else REFUSED_S):
                return info
        if peer_id not in self._asking:
            self._asking[peer_id] = asyncio.create_task(self._ask(peer_id))
        return await asyncio.shield(self._asking[peer_id])

    async def _ask(self, peer_id: PeerID) -> PeerInfo | None:
        try:
            info = await self.ask(peer_id)
        except Exception as error:  # no answer, a malformed one, a timeout: not proven, asked again later
            logger.debug("peer %s did not answer rpc_info: %s", peer_id, error)
            info = None
        finally:
            self._asking.pop(peer_id, None)
        self._answers[peer_id] = time.monotonic(), info
        self._answers.move_to_end(peer_id)
        while len(self._answers) > MAX_CALLERS:
            self._answers.popitem(last=False)
        return info
