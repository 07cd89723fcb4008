"""Running the blocks on swarm peers: one trip through B peers per span of G bytes.

`RemoteBlocks` is a block runner (see `swarm.model.steps.BlockRunner`) whose blocks live on
other peers. For each block it asks the replica that replicas.py chooses (a checkpoint it may use,
its nearest host), naming that checkpoint in the request (wire.py), and at the same moment its
witnesses: in an open swarm a replica under every other key of the checkpoint, where keys count
the fastest one; the rule of cross_check.py says which answer is used, whom to ban and whom to
credit (`Use` or `AskAgain`), and the runner applies it. When a peer times out or refuses, it is
banned for a while and the block is retried on another replica. Where every host of a block is
banned for a while (a lone host that failed once, which a moment's load or a stranger can cause), a
request waits once for the first of those bans to end rather than failing the whole generation;
hosts banned for good are never waited for.

A client that must be sure of a block runs it itself (`run_here`): it chooses and measures the
block's checkpoint as for asking, downloads its verified file once, and computes every answer of
that block here, asking no host of it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from functools import partial

import torch
from hivemind.p2p import P2P, PeerID

from swarm.checkpoints.choice import SpotCheck
from swarm.checkpoints.transfer import TransferError
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.model.families import family_of
from swarm.model.steps import Sampling
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.ledger import Witness
from swarm.p2p.messages import DenoiseRequest
from swarm.p2p.network import EventLoopThread
from swarm.p2p.reachability import ensure_direct
from swarm.serving.audit import LoneKeyAudit
from swarm.serving.cross_check import (
    NOT_COMPUTED,
    Answer,
    AskAgain,
    ComputeHere,
    CrossCheckPolicy,
    CrossCheckStats,
    Use,
    Verdict,
    disputed,
    one_voice,
    unwitnessed,
    witnessed,
)
from swarm.serving.replicas import Chosen, Replicas
from swarm.serving.server import DenoiseServicer
from swarm.serving.vetting import RETRY_AFTER_S, Vetting
from swarm.serving.wire import decode_reply, encode_request

logger = logging.getLogger(__name__)

Reply = Answer | Exception  # what a replica sent, or why it sent nothing usable


@dataclass
class RemoteBlocks:
    """A block runner over the swarm, with failover, bans and cross-checks; counts its round trips."""

    directory: SwarmDirectory
    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    request_timeout: float = 30.0
    ping_timeout: float = 5.0  # given to `replicas` when the runner is built, as `ban_seconds` is
    ban_seconds: float = 60.0  # for a replica that fails or is outvoted; one shown here to lie is banned for good
    cross_check: CrossCheckPolicy = field(default_factory=CrossCheckPolicy)
    spot_check: SpotCheck | None = None  # measures checkpoints (None: on the built-in corpus)
    checks: CrossCheckStats = field(default_factory=CrossCheckStats)
    witness: Witness | None = None  # credits the answers confirmed (cross_check.py; swarm/p2p/ledger.py)
    round_trips: int = 0  # answers of the replicas asked first (a witness's are `checks.extra_requests`)
    hop_seconds: dict[int, list[float]] = field(default_factory=dict)  # per block, each answered request
    used: dict[int, set[str]] = field(default_factory=dict)  # per block, the checkpoints (sha256) of answers used
    audit: LoneKeyAudit = field(default_factory=LoneKeyAudit)  # which answers of one voice are checked here
    run_here: frozenset[int] = frozenset()  # blocks computed here from their checkpoint's verified file, never asked

    def __post_init__(self) -> None:
        self.family = family_of(self.config)
        self.vetting = Vetting(self.p2p, self.loop, self.config, self.spot_check)
        self.replicas = Replicas(self.directory, self.p2p, self.loop, self.config, self.vetting, self.checks,
                                 self.ping_timeout, self.ban_seconds)  # fmt: skip

    def __call__(self, block: int, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor,
                 seed: int = 0, sampling: Sampling = Sampling()) -> Answer:  # fmt: skip
        """Run block `block`'s steps here (`run_here`) or on some replica, confirmed (cross_check.py):
        (state, logits, only from the last block); SwarmError when none answers."""
        request = Request(prefix, state, schedule, seed, sampling)
        waited = False
        while True:
            waited = waited or self._wait_for_a_ban_to_end(block)
            chosen = self.replicas.choose(block)
            run = self._ran_here if block in self.run_here else self._asked
            verdict = run(block, chosen, request)
            self._apply(block, chosen, verdict)
            if isinstance(verdict, Use):
                self.used.setdefault(block, set()).add(chosen.checkpoint.sha256)
                return verdict.answer

    def choose(self, block: int) -> Host:
        """The replica this runner asks for a block now (`Replicas.choose`)."""
        return self.replicas.choose(block).host

    def round_trip(self, host: Host) -> float:
        """Seconds of one P2P ping to a host, cached (`Replicas.round_trip`)."""
        return self.replicas.round_trip(host)

    def ping(self, peer_id: str) -> float:
        """Seconds of one P2P round trip (rpc_info) to a peer; inf if it does not answer in time."""
        return self.replicas.ping(peer_id)

    def _wait_for_a_ban_to_end(self, block: int) -> bool:
        """Where a new replica must be chosen for `block` and every host of it is banned for a
        while, sleep until the first ban ends; whether it slept."""
        if not self.replicas.needs_choice(block) or (wait := self.replicas.until_a_ban_ends(block)) <= 0:
            return False
        logger.warning("block %d: every host failed a moment ago; waiting %.0fs for the first ban to end", block, wait)
        time.sleep(wait)
        return True

    def _ran_here(self, block: int, chosen: Chosen, request: Request) -> Verdict:
        """The answer computed here from the chosen checkpoint's file, asking no host."""
        answer = self._computed_here(block, chosen, request)
        return NOT_COMPUTED if answer is None else Use(answer)

    def _asked(self, block: int, chosen: Chosen, request: Request) -> Verdict:
        """Ask the chosen host and, at the same moment, its witnesses (an open swarm's every other
        key, else one: `_witnesses`); the rule's verdict on their answers, or AskAgain where the
        chosen host failed (it is banned)."""
        witnesses = self._witnesses(chosen)
        answer, replies = self._ask_all(block, chosen.host, witnesses, request)
        if isinstance(answer, Exception):  # timeout, vanished peer, refusal, garbage: try another replica
            self.replicas.ban(chosen.host, f"failed ({answer})")
            return AskAgain(f"{chosen.host.peer_id} failed")
        answers = {chosen.host.peer_id: answer}
        for witness, reply in zip(witnesses, replies, strict=True):
            if isinstance(reply, Exception):  # it confirms nothing, and is banned
                self.replicas.ban(witness, f"failed as a witness ({reply})")
            else:
                answers[witness.peer_id] = reply
        if self.directory.keys_count and len(answers) < len(witnesses) + 1:
            self._ask_witnesses(chosen, answers, request, until=2)  # the next witness that answers
        return self._verdict(block, chosen, answers, request)

    def _witnesses(self, chosen: Chosen) -> list[Host]:
        """Who confirms the chosen host's answer: in an open swarm a replica under each other key of
        its checkpoint (`Replicas.voice`); where keys count, the fastest one (`Replicas.witness`)."""
        if not self.directory.keys_count:
            return self.replicas.voice(chosen, self.cross_check.voice - 1)
        witness = self.replicas.witness(chosen)  # found anew each time: see `Replicas.witness`
        return [] if witness is None else [witness]

    def _verdict(self, block: int, chosen: Chosen, answers: dict[str, Answer], request: Request) -> Verdict:
        """The confirmation rule's verdict on the chosen host's answer (first in `answers`) and its
        witnesses'. The audit's draw is made here, once per answer, after it arrived, whether or not
        the rule then needs it (audit.py)."""
        drawn = self.audit.check_this_one()
        started = time.perf_counter()
        split = disputed(answers, request.state, self.cross_check.tolerance)
        self.checks.disagreements += split
        compute_here = partial(self._computed_here, block, chosen, request)
        if self.directory.keys_count:
            verdict = self._counted(chosen, answers, request, drawn, split, compute_here)
        else:
            verdict = self._open(chosen, answers, request, drawn and not split, compute_here)
        self.checks.seconds += time.perf_counter() - started
        return verdict

    def _open(self, chosen: Chosen, answers: dict[str, Answer], request: Request, drawn: bool,
              compute_here: ComputeHere) -> Verdict:  # fmt: skip
        """In an open swarm: the keys of the checkpoint are one voice; the client's own computation
        settles what they do not agree on, checks them where a key was not heard, and audits the
        share `drawn` of what they agree on (`cross_check.one_voice`)."""
        complete = self.replicas.heard_all(chosen, answers)
        audited = drawn and complete
        self.checks.lone_checked += audited
        return one_voice(answers, complete, audited, request.state, self.cross_check.tolerance, compute_here)

    def _counted(self, chosen: Chosen, answers: dict[str, Answer], request: Request, drawn: bool, split: bool,
                 compute_here: ComputeHere) -> Verdict:  # fmt: skip
        """Where keys count: a lone key's answer audited at the share `drawn` (`unwitnessed`), or
        witnesses asked on a disagreement (`split`) until a majority can form (`witnessed`)."""
        z_in, tolerance = request.state, self.cross_check.tolerance
        if len(answers) == 1:
            host, answer = next(iter(answers.items()))
            measured = chosen.checkpoint in self.vetting.passed
            others = self.replicas.others_announce(chosen)
            audited = measured and not others and drawn
            self.checks.lone_checked += audited
            return unwitnessed(host, answer, others, measured, audited, z_in, tolerance, compute_here)
        if split:
            self._ask_witnesses(chosen, answers, request, until=self.cross_check.witnesses + 1)
        return witnessed(answers, z_in, tolerance, compute_here)

    def _ask_witnesses(self, chosen: Chosen, answers: dict[str, Answer], request: Request, until: int) -> None:
        """Ask witnesses of `chosen`'s checkpoint, one at a time, under keys not heard yet, until
        `answers` holds `until` answers or none is left; one that fails is banned."""
        while len(answers) < until and (witness := self.replicas.witness(chosen, tuple(answers))) is not None:
            self.checks.extra_requests += 1
            try:
                answers[witness.peer_id] = self._ask(witness, request)
            except Exception as error:  # a stranger's failure of any kind: banned as a witness, not fatal
                self.replicas.ban(witness, f"failed as a witness ({error})")

    def _apply(self, block: int, chosen: Chosen, verdict: Verdict) -> None:
        """Carry out `verdict` on `block`'s replicas: its bans and credits, or a new choice of replica."""
        if isinstance(verdict, AskAgain):
            if verdict.unconfirmed:
                self.checks.unconfirmed += 1
                logger.info("block %d: %s; asking again", block, verdict.why)
            self.replicas.forget(block)
            return
        if verdict.undecided:  # no replica computes what this client does: its own arithmetic may differ
            logger.warning("block %d: no replica's answer matches the one computed here; using it, banning none", block)
            self.checks.undecided += 1
        for peer_id in verdict.ban.peer_ids if verdict.ban is not None else ():
            self.checks.banned += 1
            host = next(h for h in [chosen.host, *chosen.announcing] if h.peer_id == peer_id)
            self.replicas.ban(host, verdict.ban.why, math.inf if verdict.ban.for_good else None)
            if self.witness is not None and verdict.ban.for_good:  # shown wrong here: no credit from this client
                self.witness.caught(host.peer_id, host.owner)
        if self.witness is not None:  # the ledger: answers confirmed (cross_check.py says by what)
            for host in chosen.announcing:
                if host.peer_id in verdict.credit:
                    self.witness.agreed(host.peer_id, host.owner)

    def _computed_here(self, block: int, chosen: Chosen, request: Request) -> Answer | None:
        """The block's steps computed here from the checkpoint's verified file; None (and the
        checkpoint is not used for a while) when no host serves it in time."""
        try:
            denoiser = self.vetting.weights(block, chosen.checkpoint, chosen.hosts)
        except (TransferError, SwarmError, TimeoutError) as error:
            self.checks.undecided += 1
            self.vetting.reject(chosen.checkpoint, f"an answer must be checked here and no host serves its file "
                                f"({error})", RETRY_AFTER_S)  # fmt: skip
            return None
        self.checks.computed_here += 1
        with torch.no_grad():
            state, logits = self.family.run_steps(denoiser, request.prefix, request.state, request.schedule,
                                                  request.seed, request.sampling)  # fmt: skip
        return state, (logits if block == self.config.n_blocks - 1 else None)

    def _ask_all(self, block: int, host: Host, witnesses: list[Host],
                 request: Request) -> tuple[Reply, list[Reply]]:  # fmt: skip
        """The answers of `host` and of `witnesses` to `request`, asked at the same moment; an
        exception in place of one that failed."""
        started = time.perf_counter()
        replies = self.loop.run(self._timed_all([host, *witnesses], request), self.request_timeout + 1)
        (answer, seconds), *confirmations = replies
        if not isinstance(answer, Exception):
            self.round_trips += 1
            self.hop_seconds.setdefault(block, []).append(seconds)
            if confirmations:
                self.checks.requests_checked += 1
                self.checks.seconds += max(0.0, time.perf_counter() - started - seconds)
        self.checks.extra_requests += len(confirmations)
        return answer, [reply for reply, _ in confirmations]

    async def _timed_all(self, hosts: list[Host], request: Request) -> list[tuple[Reply, float]]:
        return await asyncio.gather(*(self._timed(h, request) for h in hosts))

    async def _timed(self, host: Host, request: Request) -> tuple[Reply, float]:
        started = time.perf_counter()
        try:
            answer = await asyncio.wait_for(self._denoise(host, request), self.request_timeout)
        except Exception as error:  # a host's failure of any kind is its answer, judged by the caller
            answer = error
        return answer, time.perf_counter() - started

    def _ask(self, host: Host, request: Request) -> Answer:
        return self.loop.run(self._denoise(host, request), self.request_timeout)

    async def _denoise(self, host: Host, request: Request) -> Answer:
        want_logits = host.block == self.config.n_blocks - 1
        await ensure_direct(self.p2p, host.peer_id, self.ping_timeout)  # a relay would cut a request past 128 KiB
        stub = DenoiseServicer.get_stub(self.p2p, PeerID.from_base58(host.peer_id))
        checkpoint = host.announcement.checkpoint.sha256 if host.announcement.checkpoint else ""
        options = DenoiseRequest(block=host.block, logits=want_logits, checkpoint=checkpoint, seed=request.seed,
                                 temperature=request.sampling.temperature, reveal=request.sampling.reveal)  # fmt: skip
        message = encode_request(options, request.prefix, request.state, request.schedule)
        response = await stub.rpc_denoise(message, timeout=self.request_timeout)
        return decode_reply(self.family, self.config, response, request.state, request.schedule, want_logits)


@dataclass(frozen=True)
class Request:
    """One block's work for a span, as the client asks every replica it sends it to."""

    prefix: torch.Tensor
    state: torch.Tensor  # the family's: byte ids (masked) or noisy embeddings (gaussian)
    schedule: torch.Tensor
    seed: int
    sampling: Sampling
