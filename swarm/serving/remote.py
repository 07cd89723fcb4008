"""Running the blocks on swarm peers: one trip through B peers per span of G bytes.

`RemoteBlocks` is a block runner (see `swarm.model.steps.BlockRunner`) whose blocks live on
other peers. For each block it takes the best-ranked checkpoint (agreement among hosts, then
plausibility, then freshness: `swarm.checkpoints.choice.rank`) that a reachable host serves, and among
its hosts the one with the lowest measured round trip (pings are cached), hosts behind NAT last
(they are reached by asking them to dial back: `swarm.p2p.reachability.ensure_direct`). Each request names
that checkpoint. When a peer times out or refuses, it bans that peer for a while and retries
the block on another replica; some requests are checked against other replicas of the same
checkpoint (`swarm.serving.cross_check`), and a replica the majority contradicts is banned.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field

import torch
from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import P2P, PeerID
from hivemind.proto import runtime_pb2

from swarm.checkpoints.choice import rank
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.model.families import family_of
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.info import owns_record
from swarm.p2p.messages import DenoiseRequest, PeerInfo, refusal
from swarm.p2p.network import EventLoopThread
from swarm.p2p.pings import timed_info
from swarm.p2p.reachability import ensure_direct
from swarm.serving.cross_check import Answer, CrossCheckPolicy, CrossCheckStats, agree, majority
from swarm.serving.server import DenoiseServicer

logger = logging.getLogger(__name__)


@dataclass
class RemoteBlocks:
    """A block runner over the swarm, with failover, bans and cross-checks; counts its round trips."""

    directory: SwarmDirectory
    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    request_timeout: float = 30.0
    ping_timeout: float = 5.0
    ban_seconds: float = 60.0
    cross_check: CrossCheckPolicy = field(default_factory=CrossCheckPolicy)
    checks: CrossCheckStats = field(default_factory=CrossCheckStats)
    round_trips: int = 0
    hop_seconds: dict[int, list[float]] = field(default_factory=dict)  # per block, each answered request
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    _banned_until: dict[str, float] = field(default_factory=dict)
    _rtt: dict[tuple[str, bytes], float] = field(default_factory=dict)
    _chosen: dict[int, tuple[Host, list[Host]]] = field(default_factory=dict)  # block: (host, the others of its checkpoint)
    _checked: set[str] = field(default_factory=set)  # replicas whose answers were checked at least once

    def __post_init__(self) -> None:
        self.family = family_of(self.config)

    def __call__(self, block: int, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor,
                 seed: int = 0, temperature: float = 0.0) -> Answer:  # fmt: skip
        """Run block `block`'s steps on some replica: (state, logits, only from the last block);
        SwarmError when none answers."""
        request = Request(prefix, state, schedule, seed, temperature)
        while True:
            host = self.choose(block)
            try:
                started = time.perf_counter()
                answer = self._ask(host, request)
                self.hop_seconds.setdefault(block, []).append(time.perf_counter() - started)
                self.round_trips += 1
            except Exception as error:  # timeout, vanished peer, refusal, garbage: try another replica
                self._ban(host, f"failed ({error})")
                continue
            if host.peer_id not in self._checked or self.rng.random() < self.cross_check.fraction:
                answer = self._checked_answer(block, host, answer, request)
            return answer

    def choose(self, block: int) -> Host:
        """The replica this runner uses for a block now."""
        chosen = self._chosen.get(block)
        if chosen is not None and not self._banned(chosen[0].peer_id):
            return chosen[0]
        hosts = [h for h in self.directory.hosts(block) if not self._banned(h.peer_id)]
        groups = [list(c.hosts) for c in rank(hosts, self.config)] + [[h for h in hosts if not h.announcement.checkpoint]]
        for group in groups:
            reachable = [h for h in group if self.round_trip(h) < float("inf")]  # they answer, and own their record
            if reachable:  # at equal freshness, one behind NAT only if no direct one answers
                best = min(reachable, key=lambda h: (h.announcement.reached == "relayed", self.round_trip(h)))
                self._chosen[block] = best, [h for h in reachable if h is not best]
                return best
        raise SwarmError(f"no live peer serves block {block}")

    def _checked_answer(self, block: int, host: Host, answer: Answer, request: Request) -> Answer:
        """`answer`, or the majority's when other replicas of the same checkpoint answer otherwise."""
        started = time.perf_counter()
        self._checked.add(host.peer_id)
        self.checks.requests_checked += 1
        answers = {host.peer_id: answer}
        for witness in [w for w in self._chosen[block][1] if not self._banned(w.peer_id)][: self.cross_check.witnesses]:
            try:
                self.checks.extra_requests += 1
                answers[witness.peer_id] = self._ask(witness, request)
            except Exception as error:
                logger.info("cross-check of block %d: witness %s did not answer (%s)", block, witness.peer_id, error)
                continue
            if len(answers) == 2 and agree(answer, answers[witness.peer_id], request.state, self.cross_check.tolerance):
                break  # the first witness confirms it
        answer = self._verdict(block, host, answers, request.state)
        self.checks.seconds += time.perf_counter() - started
        return answer

    def _verdict(self, block: int, host: Host, answers: dict[str, Answer], state: torch.Tensor) -> Answer:
        if len(answers) == 1 or all(agree(answers[host.peer_id], a, state, self.cross_check.tolerance) for a in answers.values()):
            return answers[host.peer_id]
        self.checks.disagreements += 1
        winner, contradicted = majority(answers, state, self.cross_check.tolerance)
        if winner is None:
            self.checks.undecided += 1
            logger.warning("block %d: replicas %s answer one request differently, and no majority decides",
                           block, sorted(answers))  # fmt: skip
            return answers[host.peer_id]
        for peer_id in contradicted:
            self.checks.banned += 1
            self._ban(next(h for h in [host, *self._chosen[block][1]] if h.peer_id == peer_id), "contradicted by the majority")
        return answers[winner]

    def _ban(self, host: Host, why: str) -> None:
        logger.warning("block %d on %s %s; banning it for %.0fs", host.block, host.peer_id, why, self.ban_seconds)
        self._banned_until[host.peer_id] = time.monotonic() + self.ban_seconds
        if (chosen := self._chosen.get(host.block)) is not None and chosen[0].peer_id == host.peer_id:
            del self._chosen[host.block]

    def _banned(self, peer_id: str) -> bool:
        return self._banned_until.get(peer_id, 0.0) > time.monotonic()

    def round_trip(self, host: Host) -> float:
        """Seconds of one P2P ping (rpc_info) to a host, measured once and cached; inf if it fails
        (the peer is then banned for a while) or if the peer does not own the host's record."""
        key = host.peer_id, host.owner  # an impostor's record names the same peer under another key
        if key not in self._rtt:  # over the route requests will take: direct, behind NAT once it dialed us back
            self.loop.run(ensure_direct(self.p2p, host.peer_id, self.ping_timeout), self.ping_timeout + 1)
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
        return await timed_info(self.p2p, peer_id, self.ping_timeout)

    def _ask(self, host: Host, request: Request) -> Answer:
        want_logits = host.block == self.config.n_blocks - 1
        return self.loop.run(self._denoise(host, request, want_logits), self.request_timeout)

    async def _denoise(self, host: Host, request: Request, want_logits: bool) -> Answer:
        await ensure_direct(self.p2p, host.peer_id, self.ping_timeout)  # a relay would cut a request past 128 KiB
        stub = DenoiseServicer.get_stub(self.p2p, PeerID.from_base58(host.peer_id))
        checkpoint = host.announcement.checkpoint.sha256 if host.announcement.checkpoint else ""
        options = DenoiseRequest(block=host.block, logits=want_logits, checkpoint=checkpoint, seed=request.seed,
                                 temperature=request.temperature)  # fmt: skip
        tensors = (request.prefix.long(), request.state, request.schedule.float())
        message = runtime_pb2.ExpertRequest(tensors=[serialize_torch_tensor(t) for t in tensors], metadata=options.encode())
        response = await stub.rpc_denoise(message, timeout=self.request_timeout)
        if (error := refusal(response)) is not None:
            raise SwarmError(f"refused: {error}")
        outputs = [deserialize_torch_tensor(t) for t in response.tensors]
        if len(outputs) != 1 + want_logits:
            raise SwarmError("malformed reply")
        try:
            self.family.check_state(outputs[0], len(request.state))
            self.family.check_answer(request.state, request.schedule, outputs[0])
        except ValueError as error:
            raise SwarmError(f"malformed reply: {error}") from None
        if want_logits and (outputs[1].shape != (*request.state.shape[:2], 256) or not torch.isfinite(outputs[1]).all()):
            raise SwarmError("malformed logits")
        return outputs[0], (outputs[1] if want_logits else None)


@dataclass(frozen=True)
class Request:
    """One block's work for a span, as the client asks every replica it sends it to."""

    prefix: torch.Tensor
    state: torch.Tensor  # the family's: byte ids (masked) or noisy embeddings (gaussian)
    schedule: torch.Tensor
    seed: int
    temperature: float
