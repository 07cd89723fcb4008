"""Running the blocks on swarm peers: one trip through B peers per span of G bytes.

`RemoteBlocks` is a block runner (see `swarm.model.steps.BlockRunner`) whose blocks live on
other peers. For each block it takes the first checkpoint, in the order of
`swarm.checkpoints.choice.rank` (plausibility, agreement among hosts, then freshness), that it
may use (vetting.py: one measured here, or one that hosts under two keys or more serve where keys
cost something; in an open swarm every checkpoint of the block is measured first, as a fetch
does: `SwarmDirectory.keys_count`), and among its hosts the one with the lowest measured round
trip (pings are cached), hosts behind NAT last (they are reached by asking them to dial back:
`swarm.p2p.reachability.ensure_direct`).
Each request names that checkpoint. When a peer times out or refuses, it bans that peer for a
while and retries the block on another replica. Where every host of a block is banned for a
while (a lone host that failed once, which a moment's load or a stranger can cause), a request
waits once for the first of those bans to end rather than failing the whole generation; hosts
banned for good are never waited for.

No answer is used on one key's word (issue 26, items 6 and 7):
- A request to a checkpoint that another key also serves goes at the same moment to a replica
  of it under another key, a *witness*, and the answer is used only if the two are identical.
  Replicas of one checkpoint compute the same function (cross_check.py): an honest pair always
  agrees. The witness is found anew for each request among the hosts that announced the
  checkpoint when it was chosen: a replica that was banned a while (one failure, which a
  stranger can cause) or missed a ping is a witness again once its ban ends. On a disagreement
  more witnesses are asked (up to `CrossCheckPolicy.witnesses`) and a strict majority decides;
  where none can (two keys), the client computes the answer itself from the checkpoint's
  verified file (held while the checkpoint is in use: vetting.py). The answer used is never a
  contradicted one. A replica that the client's own computation contradicts is banned for the
  runner's life; one merely outvoted is banned for `ban_seconds`, as a failing one is: a
  majority of keys is no proof (two Sybil keys outvote an honest third), and an outvoted liar
  that comes back is checked, and caught, again.
- An answer with no witness is used as it is only if no other key announced the checkpoint
  and this client has measured it. Where another key announced it but none answers now, the
  client computes the answer itself and compares (a liar must not gain from its fellow
  replicas being busy or banned); where no other key announced it and it was not measured, the
  answer is dropped and the block is asked again of a checkpoint it may use, measuring lone
  ones first.
Why every answer and not a fraction: a liar that knows the policy lies only where it is not
checked. Checking the first request to a replica and then a fraction p lets one that answers
honestly until it has been checked corrupt (1 - p) / p answers on average before it is caught
(9 at p = 0.1); a random fraction from the first request does no better. Checking every answer
leaves it nothing: its first lie is caught before it is used, and gets it banned. What a liar
still gets is cost: each peer id it burns makes a client send a few more requests, or download
one checkpoint and compute one block's steps here (while no witness answers, the client
computes each answer of that block here).
What it costs (counted by `tests/test_serving.py::test_what_confirming_every_answer_costs`):
one extra request per span for each block whose checkpoint two keys or more serve (B extra
requests per span where every block has two replicas: twice an unchecked client's requests,
against about 0.1 per such block per span, after the first, under the old fraction, of which
benchmarks/serve.py measured 0.083 extra requests per request). Sent at
the same moment, the two requests cost the slower round trip of the two, not their sum. A block
whose checkpoint has one key costs no request: one download and spot check per client, as
swarm-fetch makes, then nothing; in an open swarm so does every checkpoint a block's answering
hosts announce (`SwarmDirectory.keys_count`), Sybils' included: a stranger with many keys can
make a client download as many checkpoints, once each. A disagreement costs up to `witnesses` more requests,
or the block's steps computed here (and one download where the file is not held).
Left open: the lone host of a checkpoint that passed its measurement is believed. A stranger
that serves a copy of an honest checkpoint stamped a step ahead (so that it measures as well)
and answers with other weights is caught only once a second key serves its checkpoint; a
client that must be sure can run such a block itself, as it holds its weights.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

import torch
from hivemind.p2p import P2P, PeerID

from swarm.checkpoints.choice import SpotCheck, rank
from swarm.checkpoints.download import key_of
from swarm.checkpoints.transfer import TransferError
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.model.families import family_of
from swarm.model.steps import Sampling
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.info import owns_record
from swarm.p2p.ledger import Witness
from swarm.p2p.messages import DenoiseRequest, PeerInfo
from swarm.p2p.network import EventLoopThread
from swarm.p2p.pings import timed_info
from swarm.p2p.reachability import ensure_direct
from swarm.p2p.records import CheckpointInfo
from swarm.serving.cross_check import Answer, CrossCheckPolicy, CrossCheckStats, agree, majority
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
    ping_timeout: float = 5.0
    ban_seconds: float = 60.0  # for a replica that fails or is outvoted; one shown here to lie is banned for good
    cross_check: CrossCheckPolicy = field(default_factory=CrossCheckPolicy)
    spot_check: SpotCheck | None = None  # measures checkpoints (None: on the built-in corpus)
    checks: CrossCheckStats = field(default_factory=CrossCheckStats)
    witness: Witness | None = None  # credits each answer another key's confirms (swarm/p2p/ledger.py)
    round_trips: int = 0  # answers of the replicas asked first (a witness's are `checks.extra_requests`)
    hop_seconds: dict[int, list[float]] = field(default_factory=dict)  # per block, each answered request
    used: dict[int, set[str]] = field(default_factory=dict)  # per block, the checkpoints (sha256) of answers used
    _banned_until: dict[str, float] = field(default_factory=dict)
    _rtt: dict[tuple[str, bytes], float] = field(default_factory=dict)
    _chosen: dict[int, Chosen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.family = family_of(self.config)
        self.vetting = Vetting(self.p2p, self.loop, self.config, self.spot_check)

    def __call__(self, block: int, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor,
                 seed: int = 0, sampling: Sampling = Sampling()) -> Answer:  # fmt: skip
        """Run block `block`'s steps on some replica, confirmed (see the module docstring):
        (state, logits, only from the last block); SwarmError when none answers."""
        request = Request(prefix, state, schedule, seed, sampling)
        waited = False
        while True:
            chosen = self._chosen.get(block)  # while it answers, no directory read on this hot path
            if not waited and (chosen is None or self._banned(chosen.host.peer_id)) and (wait := self._until_a_ban_ends(block)) > 0:
                logger.warning("block %d: every host failed a moment ago; waiting %.0fs for the first ban to end", block, wait)
                time.sleep(wait)
                waited = True
            self.choose(block)
            chosen = self._chosen[block]
            witness = self._witness(chosen)  # found anew each time: see `_witness`
            answer, confirmation = self._ask_pair(block, chosen.host, witness, request)
            if isinstance(answer, Exception):  # timeout, vanished peer, refusal, garbage: try another replica
                self._ban(chosen.host, f"failed ({answer})")
                continue
            if (confirmed := self._confirmed(block, chosen, answer, witness, confirmation, request)) is not None:
                self.used.setdefault(block, set()).add(chosen.checkpoint.sha256)
                return confirmed

    def choose(self, block: int) -> Host:
        """The replica this runner asks for a block now (measuring checkpoints first where `_pick`
        must)."""
        chosen = self._chosen.get(block)
        if chosen is None or self._banned(chosen.host.peer_id):
            chosen = self._chosen[block] = self._pick(block)
        return chosen.host

    def _until_a_ban_ends(self, block: int) -> float:
        """Seconds until the first host of `block` whose ban is for a while may be asked again,
        where every host that announces a checkpoint of it is banned; 0 otherwise."""
        now = time.monotonic()
        bans = [self._banned_until.get(h.peer_id, 0.0) for h in self.directory.hosts(block) if h.announcement.checkpoint]
        if not bans or min(bans) <= now:
            return 0.0
        return min((until - now for until in bans if math.isfinite(until)), default=0.0)

    def _pick(self, block: int) -> Chosen:
        """The first checkpoint in rank order that may be used; one not measured yet that needs to
        be is measured on the way (with the next ones: `Vetting.measure`). In an open swarm
        (`SwarmDirectory.keys_count` false) every one is measured first, and the first in rank order
        that `believable` keeps beside all the others is used, as swarm-fetch chooses (so a liar
        gains at most the spot check's `tolerance`)."""
        announced = [h for h in self.directory.hosts(block) if h.announcement.checkpoint]
        hosts = [h for h in announced if not self._banned(h.peer_id)]
        if not hosts:
            raise SwarmError(f"no live peer serves block {block}")
        if not (keys_count := self.directory.keys_count):
            self._measure_every_checkpoint(block, hosts)
            return self._best_measured(block, hosts, announced)
        while True:
            for candidate in rank(hosts, self.config):
                answering = self._answering(candidate.hosts)
                if self.vetting.usable(candidate, answering, keys_count):  # behind NAT only if no direct one answers
                    host = min(answering, key=lambda h: (h.announcement.reached == "relayed", self.round_trip(h)))
                    same = [h for h in announced if h.announcement.checkpoint == candidate.checkpoint]
                    return Chosen(candidate.checkpoint, host, answering, same)
                if answering and not self.vetting.known(candidate.checkpoint):
                    break  # not measured yet, and not agreed on
            else:
                raise SwarmError(f"block {block}: no live peer serves a checkpoint that two keys serve or that "
                                 "passes a measurement")  # fmt: skip
            self._measure(block, self._answering(hosts))

    def _best_measured(self, block: int, hosts: list[Host], announced: list[Host]) -> Chosen:
        """Where keys are free: the best checkpoint measured here (`Vetting.ordered`: the loss decides,
        not the stamp) that a host answers for; its witnesses are every host of the same weights,
        under any stamp (replicas of one set of weights answer alike)."""
        candidates = {c.checkpoint: c for c in rank(hosts, self.config)}
        for checkpoint in self.vetting.ordered(block, list(candidates)):
            infos = {m.candidate.checkpoint for m in checkpoint.stamps}
            same = [h for h in announced if h.announcement.checkpoint in infos]
            for measured in sorted(checkpoint.stamps, key=lambda m: m is not checkpoint.stamp):
                if answering := self._answering(candidates[measured.candidate.checkpoint].hosts):
                    host = min(answering, key=lambda h: (h.announcement.reached == "relayed", self.round_trip(h)))
                    return Chosen(measured.candidate.checkpoint, host, answering, same)
        raise SwarmError(f"block {block}: no live peer serves a checkpoint that passes a measurement")

    def _measure_every_checkpoint(self, block: int, hosts: list[Host]) -> None:
        """Measure each checkpoint that answering `hosts` serve and that was not measured yet, a
        few at a time, best-ranked first. Each round settles one or more, so there are at most as
        many rounds as hosts (a bound, should a flood of checkpoints push measured ones out of what
        `Vetting` remembers)."""
        answering = self._answering(hosts)
        for _ in answering:
            if all(self.vetting.known(c.checkpoint) for c in rank(answering, self.config)):
                return
            self._measure(block, answering)

    def _measure(self, block: int, answering: list[Host]) -> None:
        """`Vetting.measure`, its cost counted in `checks`."""
        started = time.perf_counter()
        self.checks.checkpoints_measured += self.vetting.measure(block, answering)
        self.checks.measuring_seconds += time.perf_counter() - started

    def _answering(self, hosts: list[Host] | tuple[Host, ...]) -> list[Host]:
        """Those of `hosts` that answer a ping (`round_trip`) and own their record."""
        return [h for h in hosts if self.round_trip(h) < math.inf]

    def _witness(self, chosen: Chosen, asked: tuple[str, ...] = ()) -> Host | None:
        """The fastest replica of the chosen checkpoint that answers now, under a key other than
        the chosen host's and those of the replicas `asked`. Looked up at each request, not once
        when the checkpoint was chosen: a witness banned for a while then (one failure, which a
        stranger can cause) must count again once its ban ends, or the chosen host's answers would
        go unconfirmed until it is itself banned. Replicas that answered a ping before come first:
        a record whose peer is gone is pinged (up to `ping_timeout`) only when no other is left."""
        keys = {key_of(chosen.host)} | {key_of(h) for h in chosen.announcing if h.peer_id in asked}
        live = [h for h in chosen.announcing if key_of(h) not in keys and not self._banned(h.peer_id)]
        known = [h for h in live if self._rtt.get((h.peer_id, h.owner), math.inf) < math.inf]
        return min(known or [h for h in live if self.round_trip(h) < math.inf], key=self.round_trip, default=None)

    def _ask_pair(self, block: int, host: Host, witness: Host | None, request: Request) -> tuple[Reply, Reply | None]:
        """The answers of `host` and of `witness` (if any) to `request`, asked at the same moment;
        an exception in place of one that failed."""
        started = time.perf_counter()
        asked = [host] + ([witness] if witness is not None else [])
        replies = self.loop.run(self._timed_all(asked, request), self.request_timeout + 1)
        (answer, seconds), *confirmation = replies
        if not isinstance(answer, Exception):
            self.round_trips += 1
            self.hop_seconds.setdefault(block, []).append(seconds)
            if confirmation:
                self.checks.requests_checked += 1
                self.checks.seconds += max(0.0, time.perf_counter() - started - seconds)
        self.checks.extra_requests += len(confirmation)
        return answer, (confirmation[0][0] if confirmation else None)

    async def _timed_all(self, hosts: list[Host], request: Request) -> list[tuple[Reply, float]]:
        return await asyncio.gather(*(self._timed(h, request) for h in hosts))

    async def _timed(self, host: Host, request: Request) -> tuple[Reply, float]:
        started = time.perf_counter()
        try:
            answer = await asyncio.wait_for(self._denoise(host, request), self.request_timeout)
        except Exception as error:
            answer = error
        return answer, time.perf_counter() - started

    def _confirmed(self, block: int, chosen: Chosen, answer: Answer, witness: Host | None,
                   confirmation: Reply | None, request: Request) -> Answer | None:  # fmt: skip
        """`answer` once a witness confirms it, or the right one where witnesses contradict it;
        None: the block must be asked again."""
        while isinstance(confirmation, Exception):  # a witness that fails confirms nothing: ask the next
            self._ban(witness, f"failed as a witness ({confirmation})")
            if (witness := self._witness(chosen)) is None:
                break
            confirmation = self._witness_answer(witness, request)
        if witness is None:
            return self._unwitnessed(block, chosen, answer, request)
        if agree(answer, confirmation, request.state, self.cross_check.tolerance):
            self._credit(chosen, [chosen.host.peer_id, witness.peer_id])
            return answer
        started = time.perf_counter()
        settled = self._settle(block, chosen, {chosen.host.peer_id: answer, witness.peer_id: confirmation}, request)
        self.checks.seconds += time.perf_counter() - started
        return settled

    def _unwitnessed(self, block: int, chosen: Chosen, answer: Answer, request: Request) -> Answer | None:
        """An answer no witness confirms: used as it is only from the lone key of a checkpoint
        measured here; where another key announced the checkpoint (but none answers now), checked
        against the answer computed here, since a liar beside it could otherwise wait for its
        fellow replicas to be busy or banned; None: the block must be asked again. A replica banned
        for good counts for nothing: it will never confirm, so it leaves the host alone."""
        voices = {key_of(h) for h in chosen.announcing if self._banned_until.get(h.peer_id, 0.0) < math.inf}
        if voices <= {key_of(chosen.host)}:
            if chosen.checkpoint in self.vetting.passed:
                return answer
            self.checks.unconfirmed += 1
            logger.info("block %d: no other key confirms the answer of %s, whose checkpoint is not measured; "
                        "asking again", block, chosen.host.peer_id)  # fmt: skip
            self._chosen.pop(block, None)
            return None
        if (right := self._computed_here(block, chosen, request)) is None:
            return None
        if not agree(answer, right, request.state, self.cross_check.tolerance):
            self.checks.banned += 1
            self._ban(chosen.host, "contradicted by the answer computed here", math.inf)
        return right

    def _witness_answer(self, witness: Host, request: Request) -> Reply:
        self.checks.extra_requests += 1
        try:
            return self._ask(witness, request)
        except Exception as error:
            return error

    def _settle(self, block: int, chosen: Chosen, answers: dict[str, Answer], request: Request) -> Answer | None:
        """The right answer where replicas of one checkpoint disagree: a strict majority's, or, where
        none forms, the one computed here; bans those that answered otherwise (for good only where
        the client's own computation shows it). None: nothing settles it."""
        self.checks.disagreements += 1
        while len(answers) <= self.cross_check.witnesses and (witness := self._witness(chosen, tuple(answers))):
            if isinstance(reply := self._witness_answer(witness, request), Exception):
                self._ban(witness, f"failed as a witness ({reply})")
            else:
                answers[witness.peer_id] = reply
        winner, liars = majority(answers, request.state, self.cross_check.tolerance) if len(answers) > 2 else (None, [])
        if winner is not None:  # a majority of keys is no proof (Sybil keys outvote honest ones): a ban for a while
            self._ban_all(chosen, liars, "outvoted by replicas under other keys", self.ban_seconds)
            self._credit(chosen, [p for p in answers if p not in liars])
            return answers[winner]
        if (right := self._computed_here(block, chosen, request)) is None:
            return None
        liars = [p for p, a in answers.items() if not agree(a, right, request.state, self.cross_check.tolerance)]
        if len(liars) == len(answers):  # no replica computes what this client does: its own arithmetic may differ
            logger.warning("block %d: no replica's answer matches the one computed here; using it, banning none", block)
            self.checks.undecided += 1
            return right
        self._ban_all(chosen, liars, "contradicted by the answer computed here", math.inf)
        self._credit(chosen, [p for p in answers if p not in liars])
        return right

    def _credit(self, chosen: Chosen, peer_ids: list[str]) -> None:
        """The answers of `peer_ids` (replicas of `chosen`'s checkpoint) agreed with another key's."""
        if self.witness is not None:
            for host in chosen.announcing:
                if host.peer_id in peer_ids:
                    self.witness.agreed(host.peer_id, host.owner)

    def _ban_all(self, chosen: Chosen, peer_ids: list[str], why: str, seconds: float) -> None:
        for peer_id in peer_ids:
            self.checks.banned += 1
            self._ban(next(h for h in chosen.announcing if h.peer_id == peer_id), why, seconds)

    def _computed_here(self, block: int, chosen: Chosen, request: Request) -> Answer | None:
        """The block's steps computed here from the checkpoint's verified file; None (and the
        checkpoint is not used for a while) when no host serves it in time."""
        try:
            denoiser = self.vetting.weights(block, chosen.checkpoint, chosen.hosts)
        except (TransferError, SwarmError, TimeoutError) as error:
            self.checks.undecided += 1
            self.vetting.reject(chosen.checkpoint, f"an answer must be checked here and no host serves its file "
                                f"({error})", RETRY_AFTER_S)  # fmt: skip
            self._chosen.pop(block, None)
            return None
        self.checks.computed_here += 1
        with torch.no_grad():
            state, logits = self.family.run_steps(denoiser, request.prefix, request.state, request.schedule,
                                                  request.seed, request.sampling)  # fmt: skip
        return state, (logits if block == self.config.n_blocks - 1 else None)

    def _ban(self, host: Host, why: str, seconds: float | None = None) -> None:
        """Ask `host`'s peer nothing for `seconds` (`ban_seconds` by default), or longer if it is
        banned longer already: a failure after a proven lie must not end the lie's ban."""
        seconds = self.ban_seconds if seconds is None else seconds
        logger.warning("block %d on %s %s; banning it for %s", host.block, host.peer_id, why,
                       f"{seconds:.0f}s" if math.isfinite(seconds) else "good")  # fmt: skip
        until = time.monotonic() + seconds
        self._banned_until[host.peer_id] = max(self._banned_until.get(host.peer_id, 0.0), until)
        if (chosen := self._chosen.get(host.block)) is not None and chosen.host.peer_id == host.peer_id:
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
                self._ban(host, "did not answer a ping")
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


@dataclass(frozen=True)
class Chosen:
    """The replica a runner asks for a block, and those of the same checkpoint that can confirm it."""

    checkpoint: CheckpointInfo
    host: Host
    hosts: list[Host]  # every host of the checkpoint that answered when it was chosen (its file comes from them)
    announcing: list[Host]  # every host that announced it then, banned or not: witnesses are picked among them
