"""Running the blocks on swarm peers: one trip through B peers per span of G bytes.

`RemoteBlocks` is a block runner (see `swarm.diffusion.BlockRunner`) whose blocks live on
other peers. For each block it prefers a live peer with the freshest checkpoint and the
lowest measured round trip (pings are cached); when a peer times out or refuses, it bans
that peer for a while and retries the block on another replica.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import P2P, PeerID
from hivemind.proto import runtime_pb2

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.messages import DenoiseRequest, PeerInfo, refusal
from swarm.p2p.network import EventLoopThread
from swarm.p2p.transfer import ask_info, owns_record
from swarm.serving.server import DenoiseServicer

logger = logging.getLogger(__name__)


@dataclass
class RemoteBlocks:
    """A block runner over the swarm, with failover and bans; counts its network round trips."""

    directory: SwarmDirectory
    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    request_timeout: float = 30.0
    ping_timeout: float = 5.0
    ban_seconds: float = 60.0
    round_trips: int = 0
    _banned_until: dict[str, float] = field(default_factory=dict)
    hop_seconds: dict[int, list[float]] = field(default_factory=dict)  # per block, each answered request
    _rtt: dict[tuple[str, bytes], float] = field(default_factory=dict)
    _chosen: dict[int, Host] = field(default_factory=dict)

    def __call__(self, block: int, prefix: torch.Tensor, z: torch.Tensor, sigmas: torch.Tensor):
        """Run block `block`'s steps on some replica: (z, logits); SwarmError when none answers."""
        want_logits = block == self.config.n_blocks - 1
        while True:
            host = self.choose(block)
            try:
                started = time.perf_counter()
                z_out, logits = self.loop.run(self._denoise(host, prefix, z, sigmas, want_logits), self.request_timeout)
                self.hop_seconds.setdefault(block, []).append(time.perf_counter() - started)
                self.round_trips += 1
                return z_out, logits
            except Exception as error:  # timeout, vanished peer, refusal, garbage: try another replica
                logger.warning("block %d on %s failed (%s); banning it for %.0fs", block, host.peer_id, error, self.ban_seconds)
                self._banned_until[host.peer_id] = time.monotonic() + self.ban_seconds
                self._chosen.pop(block, None)

    def choose(self, block: int) -> Host:
        """The replica this runner uses for a block now."""
        chosen = self._chosen.get(block)
        if chosen is not None and not self._banned(chosen.peer_id):
            return chosen
        listed = [h for h in self.directory.hosts(block) if not self._banned(h.peer_id)]
        candidates = [h for h in listed if self.round_trip(h) < float("inf")]  # reachable, and own their record
        if not candidates:
            raise SwarmError(f"no live peer serves block {block}")
        freshest = max(_checkpoint_step(h) for h in candidates)
        fresh = [h for h in candidates if _checkpoint_step(h) == freshest]
        self._chosen[block] = min(fresh, key=lambda h: self.round_trip(h))
        return self._chosen[block]

    def _banned(self, peer_id: str) -> bool:
        return self._banned_until.get(peer_id, 0.0) > time.monotonic()

    def round_trip(self, host: Host) -> float:
        """Seconds of one P2P ping (rpc_info) to a host, measured once and cached; inf if it fails
        (the peer is then banned for a while) or if the peer does not own the host's record."""
        key = host.peer_id, host.owner  # an impostor's record names the same peer under another key
        if key not in self._rtt:
            rtt, info = self.loop.run(self._ask_info(host.peer_id), self.ping_timeout + 1)
            if info is None:
                self._banned_until[host.peer_id] = time.monotonic() + self.ban_seconds
                return rtt
            if not owns_record(info, host):
                logger.warning("peer %s does not own a record that names it for block %d: ignored", host.peer_id, host.block)
                rtt = float("inf")
            self._rtt[key] = rtt
        return self._rtt[key]

    def ping(self, peer_id: str) -> float:
        """Seconds of one P2P round trip (rpc_info) to a peer; inf if it does not answer in time."""
        return self.loop.run(self._ask_info(peer_id), self.ping_timeout + 1)[0]

    async def _ask_info(self, peer_id: str) -> tuple[float, PeerInfo | None]:
        """(seconds, the peer's info), or (inf, None) if it does not answer in time or in form."""
        started = time.perf_counter()
        try:
            info = await ask_info(self.p2p, peer_id, self.ping_timeout)
        except Exception:  # vanished, too slow, or a reply that is not a PeerInfo
            return float("inf"), None
        return time.perf_counter() - started, info

    async def _denoise(self, host: Host, prefix, z, sigmas, want_logits: bool):
        stub = DenoiseServicer.get_stub(self.p2p, PeerID.from_base58(host.peer_id))
        request = runtime_pb2.ExpertRequest(
            tensors=[serialize_torch_tensor(t) for t in (prefix.long(), z.float(), sigmas.float())],
            metadata=DenoiseRequest(block=host.block, logits=want_logits).encode(),
        )
        response = await stub.rpc_denoise(request, timeout=self.request_timeout)
        if (error := refusal(response)) is not None:
            raise SwarmError(f"refused: {error}")
        outputs = [deserialize_torch_tensor(t) for t in response.tensors]
        if len(outputs) != 1 + want_logits or outputs[0].shape != z.shape or not torch.isfinite(outputs[0]).all():
            raise SwarmError("malformed reply")
        return outputs[0], (outputs[1] if want_logits else None)


def _checkpoint_step(host: Host) -> int:
    return host.announcement.checkpoint.step if host.announcement.checkpoint else -1
