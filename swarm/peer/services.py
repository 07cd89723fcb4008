"""The P2P side of a peer: its handle on a loop of its own, and every service it answers there.

Its own module because what a peer answers is one list to read in one place: who it is and the
model's units from the moment it has a handle (`open_p2p`; hosts it downloads its start
checkpoint from ask, in members-only swarms), the rest once it has joined (`serve_block`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from hivemind.p2p import P2P, ServicerBase

from swarm.checkpoints.transfer import BlockServicer
from swarm.model.denoiser import ModelConfig
from swarm.model.units import TokenUnits
from swarm.p2p import reachability
from swarm.p2p.gate import MemberGate
from swarm.p2p.info import InfoServicer
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread
from swarm.p2p.pings import NeighbourPings
from swarm.p2p.tokenizer import TokenizerServicer, swarm_peer_ids, units_from_swarm
from swarm.peer.parts import Entered, Joined, Wired

P2P_CALL_TIMEOUT_S = 30.0
# more services a benchmark hands a peer (`PeerHooks.servicers`, life.py), made once the block is known
ExtraServicers = Callable[[ModelConfig, int], list[ServicerBase]]


def open_p2p(
    entered: Entered, info: Callable[[], PeerInfo], initial_peers: list[str], closers: list[Callable[[], None]]
) -> Wired:
    """The P2P handle on a loop of its own (both closed by `closers`), answering who this peer is
    (`info`) from now on and the model's units."""
    loop = EventLoopThread()
    try:
        p2p = loop.run(entered.dht.replicate_p2p(), P2P_CALL_TIMEOUT_S)
    except BaseException:
        loop.close()
        raise
    closers.append(functools.partial(loop.close, p2p))
    loop.run(InfoServicer(info).add_p2p_handlers(p2p), P2P_CALL_TIMEOUT_S)
    _serve_units(entered, loop, p2p, initial_peers)
    return Wired(loop, p2p, MemberGate.over(entered.directory.membership, p2p))


def _serve_units(entered: Entered, loop: EventLoopThread, p2p: P2P, initial_peers: list[str]) -> None:
    """The model's units, fetched from the swarm's peers if this machine lacks its tokenizer
    (checked against the config's hash), and served to the peers that ask next."""
    model_config = entered.model_config
    peer_ids = functools.partial(swarm_peer_ids, initial_peers, entered.directory, model_config.n_blocks)
    units = units_from_swarm(model_config, loop, p2p, peer_ids)
    if isinstance(units, TokenUnits):
        loop.run(TokenizerServicer(units).add_p2p_handlers(p2p), P2P_CALL_TIMEOUT_S)


def serve_block(joined: Joined, extra: ExtraServicers | None) -> None:
    """Serve every P2P service (the start weights are in the denoise service already), and start
    measuring the neighbours."""
    loop, p2p = joined.wired.loop, joined.wired.p2p
    for servicer in _servicers(joined, extra):
        loop.run(servicer.add_p2p_handlers(p2p), P2P_CALL_TIMEOUT_S)
    entered, block = joined.entered, joined.claimed.block
    pings = NeighbourPings(entered.directory, p2p, loop, entered.peer_id, block, entered.model_config.n_blocks,
                           witness=joined.claimed.witness)  # fmt: skip
    joined.claimed.announcer.ping_neighbours(pings)


def _servicers(joined: Joined, extra: ExtraServicers | None) -> list[ServicerBase]:
    """Checkpoints, remote denoising, reachability, the sync's, and the `extra` ones (benchmarks);
    info is served from the moment the peer has a P2P handle (`open_p2p`)."""
    block, gate = joined.claimed.block, joined.wired.gate
    servicers = [
        BlockServicer(block, joined.replica.store, gate),
        joined.replica.denoise_service,
        reachability.ReachabilityServicer(joined.wired.p2p, public=joined.entered.reached == "direct"),
    ]
    if joined.synced.payloads is not None:
        servicers.append(joined.synced.payloads)
    if extra is not None:
        servicers += extra(joined.entered.model_config, block)
    return servicers
