"""Who a peer is: its `rpc_info` service, the call that asks it, and whether it wrote a record.

Every peer answers `rpc_info` with a `PeerInfo` (messages.py): the block it hosts, the key
its DHT records are signed with, and its latest announcement. The answer is also the ping
(pings.py), and the check that a record naming a peer was written by that peer: libp2p
authenticates the peer a call reaches, so a record cannot borrow another peer's id.

The handler keeps the name it had when it lived in the checkpoint service
(`BlockServicer.rpc_info`), so that peers of 0.2 and later answer each other.
"""

from __future__ import annotations

from collections.abc import Callable

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.p2p.directory import Host
from swarm.p2p.messages import PeerInfo

WIRE_NAME = "BlockServicer"  # the handler's name on the wire, kept from 0.2


class InfoServicer(ServicerBase):
    """A peer's `rpc_info` handler: `info()` is asked afresh for every call."""

    def __init__(self, info: Callable[[], PeerInfo]):
        self._info = info

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        name = f"{WIRE_NAME}.{method_name}"
        return name if namespace is None else f"{namespace}::{name}"

    async def rpc_info(self, request: runtime_pb2.ExpertUID, context: P2PContext) -> runtime_pb2.ExpertInfo:
        return runtime_pb2.ExpertInfo(serialized_info=self._info().encode())


async def ask_info(p2p: P2P, peer_id: str, timeout: float) -> PeerInfo:
    """A peer's `rpc_info` answer; raises (MessageError, TimeoutError, a P2P error) if there is none."""
    stub = InfoServicer.get_stub(p2p, PeerID.from_base58(peer_id))
    reply = await stub.rpc_info(runtime_pb2.ExpertUID(uid="info"), timeout=timeout)
    return PeerInfo.decode(reply.serialized_info)


def owns_record(info: PeerInfo, host: Host) -> bool:
    """Whether a peer's rpc_info answer shows the key `host`'s record was written under (a Host
    made locally, without an owner, is taken as is)."""
    return not host.owner or info.owner == host.owner
