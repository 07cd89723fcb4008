"""The model's tokenizer from the swarm: the `rpc_tokenizer` service and the calls that ask it.

The model record names the tokenizer only by the sha256 of its tokenizer.json (swarm/model/units.py),
so that the record stays small and the creator's signature covers the file all the same. Every
peer that trains or serves the model answers `rpc_tokenizer` with the file, and so does the
creator's bootstrap. A caller believes an answer only if it hashes to the record's sha256
(`add_tokenizer`): any stranger may answer, a wrong file is refused and the next peer is asked.
A peer or client that already has the file (the built-in one, a model folder's, this machine's
cache) asks nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.model.units import TokenUnits, Units, add_tokenizer
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.messages import MessageError, TokenizerReply, TokenizerRequest
from swarm.p2p.network import EventLoopThread

logger = logging.getLogger(__name__)

ASK_TIMEOUT_S = 20.0  # one peer's answer; the file is at most 1.5 MiB
PEERS_ASKED = 8  # peers asked in turn before giving up


class TokenizerServicer(ServicerBase):
    """Answers `rpc_tokenizer` with the one tokenizer this process holds (a file anyone may check)."""

    def __init__(self, units: TokenUnits):
        self.units = units

    async def rpc_tokenizer(self, request: runtime_pb2.ExpertRequest,
                            context: P2PContext) -> runtime_pb2.ExpertResponse:
        try:
            asked = TokenizerRequest.decode(request.metadata).sha256
        except MessageError as error:
            return _reply(TokenizerReply(error=str(error)[:200]))
        if asked != self.units.sha256:
            return _reply(TokenizerReply(error="not the tokenizer this peer holds"))
        return _reply(TokenizerReply(data=self.units.data))


def _reply(message: TokenizerReply) -> runtime_pb2.ExpertResponse:
    return runtime_pb2.ExpertResponse(metadata=message.encode())


async def ask_tokenizer(p2p: P2P, peer_id: str, sha256: str, timeout: float) -> bytes:
    """One peer's answer: the bytes it sends (unchecked), or an exception (MessageError, a
    refusal as SwarmError, TimeoutError, a P2P error)."""
    stub = TokenizerServicer.get_stub(p2p, PeerID.from_base58(peer_id))
    request = runtime_pb2.ExpertRequest(metadata=TokenizerRequest(sha256=sha256).encode())
    reply = TokenizerReply.decode((await stub.rpc_tokenizer(request, timeout=timeout)).metadata)
    if reply.error:
        raise SwarmError(f"peer refused: {reply.error}")
    return reply.data


def swarm_peer_ids(initial_peers: list[str], directory: SwarmDirectory, n_blocks: int) -> list[str]:
    """Who to ask: the initial peers (the creator's bootstrap, as a rule), then every block's hosts."""
    ids = [maddr.rsplit("/p2p/", 1)[1] for maddr in initial_peers if "/p2p/" in maddr]
    return ids + [host.peer_id for hosts in directory.all_hosts(n_blocks).values() for host in hosts]


def units_from_swarm(config: ModelConfig, loop: EventLoopThread, p2p: P2P, peer_ids: Callable[[], list[str]]) -> Units:
    """The config's units: from this machine if it has them, else from the first of `peer_ids()`
    (asked only then) whose answer hashes to the config's tokenizer; SwarmError if none does."""
    try:
        return config.units()
    except SwarmError:
        if config.tokenizer is None:
            raise
    for peer_id in list(dict.fromkeys(peer_ids()))[:PEERS_ASKED]:  # each once, in order
        try:
            data = loop.run(ask_tokenizer(p2p, peer_id, config.tokenizer, ASK_TIMEOUT_S), ASK_TIMEOUT_S + 5)
            add_tokenizer(data, config.tokenizer)
            return config.units()
        except Exception as error:  # a stranger's answer: any failure just moves on to the next peer
            logger.warning("tokenizer from %s refused: %s", peer_id,
                           str(error).splitlines()[0] if str(error) else error)
    raise SwarmError(f"no peer of the swarm served this model's tokenizer ({config.tokenizer[:12]}...)")
