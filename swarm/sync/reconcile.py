"""Bringing a block's drifted replicas back together, on evidence measured here.

Replicas that applied the same payloads hold the same weights and announce the same sha256
for a checkpoint of the same step. At a round's step (every `average_every` steps: swarm/peer/training.py
and `ReconcileRound.due`) each saves its checkpoint, reads the others' checkpoints of that step,
downloads the distinct ones all at once within the round's one deadline, verified like any other
(size, sha256, finite weights of this block) and spot-checked on this replica's private windows
(swarm/checkpoints/measure.py, spot_check.py), and takes the coordinate-wise median of its own
weights and the others' that passed.

Evidence first. A downloaded checkpoint takes part only if it measures within `NOISE` of the best
of the round, this replica's own weights included, on the same windows and draws (`_passed`), and
only if it is not much better on held-out text than on the training text (`spot_check.suspicion`:
it has seen the held-out text; a fetch refuses to prefer one, and here it neither sets the bar,
which would leave honest weights out, nor takes part). A
checkpoint is a claim, whoever announces it: two free keys that announced one checkpoint at the
merge step beside a lone replica were a strict majority of the voices, the median was their
tensors bit for bit, and the replica then saved and announced them under its honest key (issue
57). Now nothing that measures worse than what the replica holds reaches its weights. Its own
weights take part on the same terms: a replica that dozed and trained alone meanwhile measures
worse than the others, and takes their weights instead of pulling the median its way (before, it
stayed apart round after round). Left open: a checkpoint that measures as well as the best (within
`NOISE`) and is bad where the spot check does not look, which no measurement here can tell from an
honest one; one that measures better than own by more than `NOISE` now replaces it, where before
it was averaged with it.

How the checkpoints that passed are weighed depends on what a key costs (`SwarmDirectory.keys_count`):
- in an open swarm (the default) a key is free, so a count of keys is no evidence: each distinct
  checkpoint is one voice, its own included, however many keys announce it. The median then
  decides nothing the spot check has not already let through; it makes replicas that read the
  same checkpoints compute the same weights;
- where keys count (members-only, or identity work: a key carries the creator's certificate or
  its work), agreement is evidence, so the rule of issue 46 stays: each checkpoint weighs as many
  lineage voices as vouch for it (swarm/checkpoints/measure.py `vouchers_among`), its own included.
  A host whose record says it took its checkpoint from one key alone is that key's voice, and no
  group counts more voices than it has keys, so a replica that adopted a stranger's block and serves
  it bit for bit adds no voice to the stranger's word. A checkpoint vouched for by a strict majority
  of the voices is the median bit for bit (honest members that agree outvote any minority, which
  moves nothing at all); otherwise every coordinate lands between values honest replicas hold, as
  long as fewer than half the voices lie.
In both, with fewer than `MIN_VOICES` voices among its own record and the hosts of the checkpoints
that passed (two replicas), the replica keeps its own weights and says so: two voices have no
middle. In an open swarm this count is no defence (free keys pass it); it only keeps a pair of
replicas from mixing their weights, as where keys count.
Every replica that reads the same checkpoints computes the same median (the voices are taken in
sha256 order), so replicas that drifted become identical again.

Waits: a replica that takes no part costs a bounded time once, not every round. A round waits up
to half the deadline only for replicas it has evidence of: in the first round, those whose payloads
made this replica's last sync update (`voters`: they train beside it, step for step), or every
listed one where the sync swaps no payloads (`--sync none`, `dense`); after it, those that took
part in the last round and never missed one they were waited for. The rest (silent keys, fresh
keys, latecomers) get `NEWCOMER_GRACE_S`: a record is anyone's claim to be a replica, and free keys
whose records named them replicas and that never announced a checkpoint held a lone replica's
first round for 30 s (issue 57). The downloads run at once
under what is left of the deadline, a slow host dropped as measure.py drops one, so a stalling
stranger does not hold the others' downloads back.

This replaces hivemind's averager for these rounds: a groupmate there picks its own weight,
the part it reduces comes back as whatever it sends, and it may announce a message of any
length. Here every byte arrives through the bounded, verified checkpoint download.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hivemind.p2p import P2P

from swarm.checkpoints.measure import Candidate, Measured, measure_candidates, vouchers_among
from swarm.checkpoints.spot_check import NOISE, SpotCheck
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import ModelConfig, build_block
from swarm.p2p.directory import DHTUnavailable, Host
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo
from swarm.waiting import WaitStopped

logger = logging.getLogger(__name__)

MIN_VOICES = 3  # independent voices needed before a replica lets the others change its weights
POLL_S = 1.0  # how often the replicas' records are read while waiting for their checkpoints
NEWCOMER_GRACE_S = 3.0  # how long a round waits for listed replicas it has no evidence of (module docstring)
MEASURE_SLACK_S = 10.0  # past the round's deadline: a spot check begun before it may finish


@dataclass(frozen=True)
class Voice:
    """One distinct checkpoint of the round: its sha256, its tensors, and the independent voices that vouch for
    it (`weigh`)."""

    sha256: str
    tensors: dict[str, torch.Tensor]
    vouchers: int


def weighted_median(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise weighted median of `stacked` (groups x ...) with one weight per group:
    at each coordinate, the smallest value whose cumulative weight reaches half of the total, or,
    where it reaches exactly half, the mean of that value and the next (of two voices, their mean:
    the smaller alone pulled every merged weight down)."""
    values, order = stacked.sort(dim=0)
    cumulative = weights.to(stacked.device)[order].cumsum(dim=0)
    total = weights.sum().to(stacked.device)
    first = (cumulative * 2 >= total).to(torch.int8).argmax(dim=0, keepdim=True)
    low = values.gather(0, first)
    high = values.gather(0, (first + 1).clamp(max=len(stacked) - 1))
    return torch.where(cumulative.gather(0, first) * 2 == total, (low + high) / 2, low).squeeze(0)


def median_of(voices: list[Voice], keys_count: bool = True) -> dict[str, torch.Tensor]:
    """The coordinate-wise median of the voices' tensors, each weighted by its vouchers where `keys_count`,
    else one each (module docstring). A voice that outweighs all the others together is returned as it
    is. Whether enough voices spoke for a median is the round's to judge (`ReconcileRound.run`)."""
    voices = sorted(voices, key=lambda v: v.sha256)
    weights = torch.tensor([float(v.vouchers) if keys_count else 1.0 for v in voices], device="cpu")
    leader = int(weights.argmax())
    if 2 * weights[leader] > weights.sum():
        return {name: tensor.clone() for name, tensor in voices[leader].tensors.items()}
    return {name: weighted_median(torch.stack([v.tensors[name] for v in voices]), weights)
            for name in voices[0].tensors}  # fmt: skip


def weigh(own: Host, others: dict[CheckpointInfo, list[Host]]) -> dict[CheckpointInfo, int]:
    """Each checkpoint's weight in the round: the voices that vouch for it (`vouchers_among`), never more
    than its distinct keys. `own` is this replica's record, counted in one group with the hosts that
    agree with it: apart, a host that took its checkpoint from this replica's key would count as a
    second voice of that key, and a replica that took its own weights from one key alone would vouch
    for them beside that key."""
    checkpoint = own.announcement.checkpoint
    weights = {c: vouchers_among(hosts) for c, hosts in others.items() if c != checkpoint}
    weights[checkpoint] = vouchers_among([own, *others.get(checkpoint, [])])
    return weights


@dataclass
class ReconcileRound:
    """One replica's side of the rounds: at a round's step, gather the other replicas'
    checkpoints of that step, keep those that measure as well as its own, and take the median
    (module docstring).

    Args:
        hosts: reads the block's hosts from the DHT now (the replica's own record included).
        own_key: the key this replica's records are signed with.
        deadline: how long a round waits for the others' checkpoints of its step, downloads and spot checks included.
        spot_check: this replica's private measure (the peer's `Replica.spot_check`).
        keys_count: whether a count of keys is evidence in this swarm, read at each round
            (`SwarmDirectory.keys_count`: the directory learns it from the creator's model record).
        voters: the peer ids of the other replicas whose payloads made this replica's last sync
            update (`Exchange.voters`); None where the sync swaps no payloads.
        stop: set when the peer is told to stop: a round ends at once, the weights kept (a round
            that waited out its deadline for a killed replica's checkpoint held a stopping peer
            past the 15 s a supervisor gives it before SIGKILL: tests/test_chaos.py saw it).
    """

    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    block: int
    own_key: bytes
    hosts: Callable[[], list[Host]]
    deadline: float
    spot_check: SpotCheck
    keys_count: Callable[[], bool]
    stop: threading.Event = field(default_factory=threading.Event)
    voters: Callable[[], frozenset[str]] | None = None
    drift: float | None = None  # the largest change the last merge made to a weight
    # keys that announced the last round's step in time (None: no round yet); keys a round waited for in full in vain
    took_part: set[bytes] | None = field(default=None, init=False)
    missed: set[bytes] = field(default_factory=set, init=False)

    def due(self, may_have_drifted: Callable[[], bool]) -> bool:
        """Whether a round at a scheduled step runs. In an open swarm always: a replica learns that the
        others drifted from their fingerprints (swarm/sync/exchange.py), which any stranger makes up
        (one well-formed payload under a made-up fingerprint forced a round: issue 57), and which an
        honest joiner's side may never see (its fingerprint differs only on its first round). A round
        is safe to run whoever asks (only checkpoints that measure as well as own take part) and costs
        a save, an announcement and a bounded wait; every replica runs it at the same steps, so those
        that drifted all take part. Where keys count, members' fingerprints are evidence: when
        `may_have_drifted` says so."""
        return not self.keys_count() or may_have_drifted()

    def run(self, module: torch.nn.Module, own: BlockAnnouncement, replicas: int) -> bool | None:
        """Merge `module` with the others' checkpoints of its step that pass, waiting for up to `replicas`
        other replicas. `own` is the record this replica announced for the step: its checkpoint is
        `module`'s, and its lineage says whose voice that is (`weigh`). True if the weights changed,
        False if they were the median already, None if too few voices spoke to judge (weights kept)."""
        started, checkpoint = time.monotonic(), own.checkpoint
        if checkpoint is None:
            raise SwarmError("a merge round runs on a checkpoint this replica announced; its record holds none")
        groups = self._checkpoints_of(checkpoint, replicas, started)
        if self.stop.is_set():
            logger.info("step %d: stopping: the merge round ends, weights kept", checkpoint.step)
            return None
        own_host = Host(self.block, own, math.inf, owner=self.own_key)
        if (voiced := sum(weigh(own_host, groups).values())) < MIN_VOICES:  # no median could come of a download
            logger.info("step %d: %d voices hold checkpoints of this step (%d needed to judge): weights kept",
                        checkpoint.step, voiced, MIN_VOICES)  # fmt: skip
            return None
        others = {c: hosts for c, hosts in groups.items() if c != checkpoint}
        measured = self._measured(others, started + self.deadline)
        if measured is None:
            logger.info("step %d: stopping: the merge round ends, weights kept", checkpoint.step)
            return None
        own_passes, passed = self._passed(module, measured, checkpoint.step)
        weights = weigh(own_host, {c: groups[c] for c in [checkpoint, *(m.candidate.checkpoint for m in passed)]
                                   if c in groups})  # fmt: skip
        if (heard := sum(weights.values())) < MIN_VOICES:  # downloads that failed or did not pass
            logger.info("step %d: only %d voices' checkpoints arrived and measured as well as the best of the round "
                        "(%d needed to judge): weights kept", checkpoint.step, heard, MIN_VOICES)  # fmt: skip
            return None
        if not passed:
            return False  # every voice that counts holds these very weights: they are the median already
        voices = [Voice(checkpoint.sha256, _tensors(module), weights[checkpoint])] if own_passes else []
        voices += [Voice(m.candidate.checkpoint.sha256, self._tensors_of(m, module), weights[m.candidate.checkpoint])
                   for m in passed]  # fmt: skip
        merged = median_of(voices, self.keys_count())
        return self._adopt(module, merged, checkpoint.step)

    def _checkpoints_of(self, own: CheckpointInfo, replicas: int, started: float) -> dict[CheckpointInfo, list[Host]]:
        """The other hosts' checkpoints of `own.step`, by checkpoint, once `replicas` hosts announce one, the
        peer is stopping, or the wait is over: half the deadline, or once those awaited in full (`_awaited`)
        are in and `NEWCOMER_GRACE_S` has passed."""
        while True:
            groups, listed = self._announced(own.step)
            announced = {h.owner for hosts in groups.values() for h in hosts}
            awaited, waited = self._awaited(listed), time.monotonic() - started
            settled = waited >= NEWCOMER_GRACE_S and awaited <= announced
            if len(announced) >= replicas or settled or waited + POLL_S > self.deadline / 2:
                break
            if self.stop.wait(POLL_S):
                break
        if not self.stop.is_set():
            self.missed |= awaited - announced
            self.took_part = announced
        return groups

    def _awaited(self, listed: dict[bytes, str]) -> set[bytes]:
        """The listed keys a round waits for in full: in the first round those whose peer ids voted in the
        last sync update (all of them where the sync swaps no payloads); after it, those that took part in
        the last round and never missed one they were waited for in."""
        if self.took_part is not None:
            return (self.took_part - self.missed) & listed.keys()
        if self.voters is None:
            return set(listed)
        voters = self.voters()
        return {key for key, peer_id in listed.items() if peer_id in voters}

    def _announced(self, step: int) -> tuple[dict[CheckpointInfo, list[Host]], dict[bytes, str]]:
        """The other hosts' checkpoints of `step`, by checkpoint, and every other host listed: key, peer id."""
        try:
            hosts = [h for h in self.hosts() if h.owner != self.own_key]
        except DHTUnavailable as error:
            logger.warning("step %d: %s", step, error)
            hosts = []
        groups: dict[CheckpointInfo, list[Host]] = {}
        for host in hosts:
            checkpoint = host.announcement.checkpoint
            if checkpoint is not None and checkpoint.step == step:
                groups.setdefault(checkpoint, []).append(host)
        return groups, {h.owner: h.peer_id for h in hosts}

    def _measured(self, others: dict[CheckpointInfo, list[Host]], give_up_at: float) -> list[Measured] | None:
        """The others' checkpoints downloaded all at once, verified and spot-checked within what is left of
        the round's deadline (measure.py: those that fail or are slow are left out, and logged); None if
        the peer is told to stop meanwhile."""
        if not others:
            return []
        candidates = [Candidate(c, tuple(hosts), plausible=True) for c, hosts in sorted(
            others.items(), key=lambda item: item[0].sha256)]  # fmt: skip
        left = max(1.0, give_up_at - time.monotonic())
        measuring = measure_candidates(self.p2p, candidates, self.config, self.block, self.spot_check, deadline_s=left)
        try:
            return self.loop.run(measuring, left + MEASURE_SLACK_S, self.stop)
        except WaitStopped:
            return None
        except TimeoutError:
            logger.warning("block %d: the others' checkpoints were not measured in time: none takes part", self.block)
            return []

    def _passed(self, module: torch.nn.Module, measured: list[Measured], step: int) -> tuple[bool, list[Measured]]:
        """Whether this replica's own weights take part, and which of `measured` do: those whose loss
        is within `NOISE` of the best of the round, own included, on the same windows and draws (a
        NaN passes nothing), and that are not suspicious (`_suspicious`); the others are logged. Own
        weights that measure worse than that (a replica that dozed and trained alone meanwhile) give
        way to the better ones, so it is brought back to the others, not averaged with them."""
        if not measured:
            return True, []
        own = self.spot_check.measure(self._on_cpu(module), self.config, self.block)
        fair = [m for m in measured if not self._suspicious(m, step)]
        best = min((loss for loss in [own, *(m.loss for m in fair)] if math.isfinite(loss)), default=math.inf)
        passed = []
        for m in fair:
            if m.loss <= best + NOISE:
                passed.append(m)
            else:
                logger.warning("step %d: the checkpoint %s of %s takes no part in the merge: it measures %.3f here, "
                               "more than %.3f above the best of the round, %.3f (this replica's own: %.3f)", step,
                               m.candidate.checkpoint.sha256[:12], sorted(h.peer_id for h in m.candidate.hosts)[:3],
                               m.loss, NOISE, best, own)  # fmt: skip
        if own > best + NOISE:
            logger.info("step %d: this replica's own weights measure %.3f, more than %.3f above the best of the round "
                        "(%.3f): they take no part in the merge", step, own, NOISE, best)  # fmt: skip
        return own <= best + NOISE, passed

    @staticmethod
    def _suspicious(measured: Measured, step: int) -> bool:
        """Whether `measured` scores so much better on held-out text than on the training text that it has
        seen the held-out text (`spot_check.suspicion`, the test a fetch applies): such a checkpoint neither
        sets the round's bar nor takes part, logged. A fetch may still take one, last, where nothing else
        passes; a merge has its own weights to keep instead."""
        why = measured.judge_suspicion()
        if why:
            logger.warning("step %d: the checkpoint %s of %s takes no part in the merge: %s", step,
                           measured.candidate.checkpoint.sha256[:12],
                           sorted(h.peer_id for h in measured.candidate.hosts)[:3], why)  # fmt: skip
        return why is not None

    def _on_cpu(self, module: torch.nn.Module) -> torch.nn.Module:
        """A copy of `module`'s weights in a block on the CPU: measured as the downloaded ones are."""
        with torch.device("cpu"):
            block = build_block(self.config, self.block)
        block.load_state_dict(module.state_dict())
        return block

    def _tensors_of(self, measured: Measured, like: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The tensors of a measured checkpoint, on the device and in the dtype of `like`'s weights (the
        median is taken beside them)."""
        return _tensors(decode_block(measured.data, self.config, self.block)[0].to(next(like.parameters())))

    def _adopt(self, module: torch.nn.Module, merged: dict[str, torch.Tensor], step: int) -> bool:
        with torch.no_grad():
            state = module.state_dict()
            self.drift = max(((merged[name] - state[name]).abs().max().item() for name in state), default=0.0)
            module.load_state_dict(merged)
        logger.info("step %d: merged the replicas' checkpoints; the largest change to a weight was %.3g", step,
                    self.drift)  # fmt: skip
        return self.drift > 0


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}
