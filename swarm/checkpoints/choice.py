"""Which checkpoint of a block to believe: plausibility, measured quality, then agreement among hosts.

What a host announces (a step, a size, a loss) is a claim. A checkpoint is chosen on evidence:
1. Plausibility. An announced size above what a block of this model weighs is never downloaded.
   Candidates (one per announced (step, sha256, size, chunks), with every host that announces it) are
   measured in `rank` order: those a key the swarm's ledger credits announces first (`backed`: a
   flood of fresh keys cannot push a host with checked work past the measured ones), then plausible
   steps (a step far beyond every other host's, more than twice theirs plus `STEP_LEAD`, is not),
   then more independent vouchers, then the newest. That order says what is measured first; it
   decides nothing.
2. Measurement. Candidates are downloaded, verified and spot-checked all at once, within one
   deadline, slow hosts dropped (measure.py), on windows and noise draws this process drew at
   random and nobody else knows (spot_check.py). A candidate is kept only if its score is within
   `tolerance` of the best unsuspicious candidate's (a block tuned to the check cannot set that
   bar), no worse than a uniform guess, and not far worse than the loss its hosts announce.
3. Evidence, not stamps (`by_evidence`). Kept candidates whose decoded weights are bit for bit the
   same are one checkpoint, whatever steps their files are stamped with: their hosts vouch together,
   and its step is the lowest stamp (where keys count: the stamp most keys announce, ties the lowest).
   Checkpoints are then ordered by the loss measured here: those within `NOISE` of the best (the best
   unsuspicious one) first, then
   more independent vouchers where keys cost something, then the lower loss. A claimed step earns
   nothing: a newer checkpoint wins only by measuring better. Suspicious ones (spot_check.py
   `suspicion`: far better on held-out text than on training text) come last, and are logged.
4. The step to take (`Choice.step`). The chosen checkpoint's step is believed only as far as other
   keys' measured checkpoints (other weights, a finite loss no worse than a uniform guess, kept or
   not) and the caller's own make plausible: at most the highest of theirs plus `STEP_LEAD`. A
   joiner may adopt the weights of a checkpoint stamped far ahead, not its step: one record cannot
   move a joiner's schedule. A block with no other measured checkpoint has only its own stamp.

How many are measured depends on what a key costs (`SwarmDirectory.keys_count`, which the
callers pass on). Where keys cost something (members-only, or identity work), agreement is
evidence and the best-ranked `MEASURED_WHERE_KEYS_COUNT` are measured. In an open swarm a key
costs nothing: three Sybil keys, each announcing a different degraded copy of a block a save or
two ahead of its lone honest host, would fill those three and the honest checkpoint would never
be measured beside them (issue 27). There every candidate is measured, implausible ones too, up
to `MEASURED_AT_MOST`, all at once within the deadline (measure.py). Past the bound, a host the
ledger credits is still measured; left open: an unbacked honest host behind more distinct
checkpoints than the bound, and a flood whose keys are credited too (two keys attesting each
other's work credit it: ledger.py).

Vouchers are independent voices (measure.py `vouchers_among`): distinct keys, where a host whose
record says it took the checkpoint from one key alone (`BlockAnnouncement.taken_from`, which a
joiner that adopts a checkpoint announces: `Choice.taken_from`) is that key's voice. A joiner that
adopted a stranger's block and serves it bit for bit adds no voucher (laundering, issue 46).

`swarm-fetch`, a joining peer, the chaos monkey and the generation client all choose
through here (the generation client measures with `measure_candidates` and orders with
`believable` and `by_evidence`: swarm/serving/vetting.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass, field

from hivemind.p2p import P2P

from swarm.checkpoints.download import key_of
from swarm.checkpoints.measure import (
    MEASURE_DEADLINE_S,
    Candidate,
    Measured,
    measure_candidates,
    voices,
    vouchers_among,
)
from swarm.checkpoints.spot_check import NOISE, SPOT_CHECK_WINDOWS, Losses, SpotCheck, weights_hash
from swarm.checkpoints.transfer import max_checkpoint_bytes
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import Host
from swarm.p2p.records import MAX_TAKEN_FROM, CheckpointInfo, owner_fingerprint

__all__ = [
    "NOISE",
    "SPOT_CHECK_WINDOWS",
    "Candidate",
    "Checkpoint",
    "Choice",
    "Measured",
    "SpotCheck",
    "believable",
    "by_evidence",
    "choose_checkpoint",
    "measure_candidates",
    "rank",
    "uniform_ce",
]  # fmt: skip

logger = logging.getLogger(__name__)


def uniform_ce(config: ModelConfig) -> float:
    """The loss of a block that knows nothing: a uniform guess over the model's units."""
    return math.log(config.vocab_size)


STEP_LEAD = 100  # steps a checkpoint may lead every other key's (two saves at the peer's default)
MEASURED_WHERE_KEYS_COUNT = 3  # candidates measured where keys cost something: agreement ranks them
MEASURED_AT_MOST = 32  # where keys are free: every candidate, but a flood stops here


def rank(hosts: list[Host], config: ModelConfig, backed: Collection[str] = ()) -> list[Candidate]:
    """The checkpoints `hosts` announce, in the order to measure them: those a key in `backed` (the
    fingerprints of keys the ledger credits: swarm/p2p/ledger.py `backed_keys`) announces first, then
    plausible before implausible, then more vouchers, then the newest step; sizes no block of `config`
    can have are left out."""
    groups: dict[CheckpointInfo, list[Host]] = {}
    largest = max_checkpoint_bytes(config)
    for host in hosts:
        info = host.announcement.checkpoint
        if info is not None and info.size <= largest:
            groups.setdefault(info, []).append(host)
    candidates = [Candidate(info, tuple(group), _plausible(info, group, hosts), _backed(group, backed))
                  for info, group in groups.items()]  # fmt: skip
    return sorted(candidates, key=lambda c: (c.backed, c.plausible, c.vouchers, c.checkpoint.step), reverse=True)


def _backed(hosts: list[Host], backed: Collection[str]) -> bool:
    return any(owner_fingerprint(key_of(h)) in backed for h in hosts)


def _plausible(info: CheckpointInfo, vouching: list[Host], everyone: list[Host]) -> bool:
    others = [h.announcement.step for h in everyone if h not in vouching and h.announcement.state != "joining"]
    return not others or info.step <= 2 * max(others) + STEP_LEAD


@dataclass
class Checkpoint:
    """Kept candidates whose weights are bit for bit the same: one checkpoint under one or more stamps."""

    stamps: list[Measured]
    keys_count: bool = False  # the swarm's `SwarmDirectory.keys_count`: whether agreement among keys is evidence

    @property
    def loss(self) -> float:
        return self.stamps[0].loss

    @property
    def hosts(self) -> list[Host]:
        return [h for m in self.stamps for h in m.candidate.hosts]

    @property
    def vouchers(self) -> int:
        return vouchers_among(self.hosts)

    @property
    def suspicious(self) -> str | None:
        return next((m.suspicious for m in self.stamps if m.suspicious), None)

    @property
    def stamp(self) -> Measured:
        """The lowest step the same weights are stamped with (a later stamp claims training that changed
        nothing); where keys count, the stamp most keys announce first. In an open swarm a count of keys is
        no evidence: two free keys re-stamping a lone host's weights far ahead would set every joiner's
        step (issue 57)."""
        if self.keys_count:
            return min(self.stamps, key=lambda m: (-m.candidate.vouchers, m.candidate.checkpoint.step))
        return min(self.stamps, key=lambda m: m.candidate.checkpoint.step)


@dataclass
class Choice:
    """The chosen checkpoint of a block, and every candidate measured on the way."""

    data: bytes
    checkpoint: CheckpointInfo
    loss: float
    chosen: Measured | None  # None: the caller's own checkpoint won
    measured: list[Measured] = field(default_factory=list)
    passed: list[Measured] = field(default_factory=list)  # those that passed the spot check (credited: ledger.py)
    step: int | None = None  # the step to take: the checkpoint's, bounded by what others make plausible
    vouched_by: list[Host] = field(default_factory=list)  # every host of its weights, under any stamp

    def __post_init__(self) -> None:
        if self.step is None:
            self.step = self.checkpoint.step

    @property
    def host(self) -> Host | None:
        return self.chosen.host if self.chosen else None

    @property
    def taken_from(self) -> tuple[str, ...]:
        """The lineage a caller that adopts these weights announces (`BlockAnnouncement.taken_from`): the
        voices that vouched for them (at most `MAX_TAKEN_FROM`; whether one or more is what counts)."""
        return tuple(sorted(voices(self.vouched_by)))[:MAX_TAKEN_FROM]


async def choose_checkpoint(
    p2p: P2P,
    hosts: list[Host],
    config: ModelConfig,
    block: int,
    spot_check: SpotCheck,
    own: tuple[bytes, CheckpointInfo] | None = None,
    keys_count: bool = False,
    show_progress: bool = False,
    deadline_s: float = MEASURE_DEADLINE_S,
    backed: Collection[str] = (),
) -> Choice:
    """The checkpoint of `block` to believe (see the module docstring); `own` is a checkpoint the
    caller already trusts (its own file), measured beside the others and kept unless another
    newer one measures at least as well (within `NOISE`); `keys_count`: the swarm's
    `SwarmDirectory.keys_count` (false, the default, measures more, never less); `backed`: the keys
    whose hosts are measured first (swarm/p2p/ledger.py `backed_keys`). SwarmError if none passes."""
    candidates = rank(hosts, config, backed)
    max_candidates = MEASURED_WHERE_KEYS_COUNT if keys_count else MEASURED_AT_MOST
    logger.info("block %d: %d hosts announce %d checkpoints (steps %s); measuring up to %d", block, len(hosts),
                len(candidates), [c.checkpoint.step for c in candidates], max_candidates)  # fmt: skip
    measured = await measure_candidates(p2p, candidates[:max_candidates], config, block, spot_check, show_progress,
                                        deadline_s)  # fmt: skip
    own_losses, own_weights = None, None
    if own is not None:
        denoiser = decode_block(own[0], config, block)[0]
        own_losses, own_weights = spot_check.losses(denoiser, config, block), weights_hash(denoiser)
    passed = believable(measured, spot_check.tolerance, uniform_ce(config), own_losses.score if own else None)
    ordered = by_evidence(passed, keys_count)
    eligible = ordered if own is None else [c for c in ordered if _replaces_own(c, own[1], own_losses, own_weights)]
    if eligible:
        chosen = eligible[0]
        step = believed_step(chosen, _genuine(measured, uniform_ce(config)), own[1].step if own else None)
        stamp = chosen.stamp
        return Choice(stamp.data, stamp.candidate.checkpoint, stamp.loss, stamp, measured, passed, step, chosen.hosts)
    if own is not None:
        return Choice(own[0], own[1], own_losses.score, None, measured, passed)
    raise SwarmError(f"block {block}: no checkpoint verified and passed the spot check ({len(measured)} measured, "
                     f"{len(hosts)} hosts)")  # fmt: skip


def _replaces_own(checkpoint: Checkpoint, own: CheckpointInfo, own_losses: Losses, own_weights: str) -> bool:
    """Whether a kept checkpoint replaces the caller's own: other weights, a newer stamp, and a loss at
    least as good (within `NOISE`)."""
    return (checkpoint.stamps[0].weights != own_weights and checkpoint.stamp.candidate.checkpoint.step > own.step
            and checkpoint.loss <= own_losses.score + NOISE)  # fmt: skip


def _weights(checkpoint: Checkpoint) -> str:
    first = checkpoint.stamps[0]
    return first.weights or first.candidate.checkpoint.sha256


def by_evidence(passed: list[Measured], keys_count: bool) -> list[Checkpoint]:
    """`passed` as checkpoints (the same weights under any stamp are one), best first: unsuspicious
    before suspicious, within `NOISE` of the best unsuspicious loss before the rest, then (where
    `keys_count`) more independent vouchers, then the lower loss, then the lower step."""
    checkpoints: dict[str, Checkpoint] = {}
    for m in passed:
        checkpoints.setdefault(_weights(Checkpoint([m])), Checkpoint([], keys_count)).stamps.append(m)
    found = list(checkpoints.values())
    best = min((c.loss for c in found if not c.suspicious), default=min((c.loss for c in found), default=math.inf))

    def order(c: Checkpoint) -> tuple:
        return (c.suspicious is not None, c.loss > best + NOISE, -c.vouchers if keys_count else 0, c.loss,
                c.stamp.candidate.checkpoint.step)  # fmt: skip

    return sorted(found, key=order)


def _genuine(measured: list[Measured], uniform: float) -> list[Checkpoint]:
    """The measured checkpoints that look like training's work, kept or not (an older honest
    checkpoint far worse than the best is still evidence of the swarm's progress): a finite loss
    no worse than knowing nothing, and not suspicious."""
    return by_evidence([m for m in measured if math.isfinite(m.loss) and m.loss <= uniform + 0.5 and not m.suspicious],
                       keys_count=False)  # fmt: skip


def believed_step(chosen: Checkpoint, others: list[Checkpoint], own_step: int | None = None) -> int:
    """The chosen checkpoint's step, at most `STEP_LEAD` past the highest step of another measured
    checkpoint (other weights) that another key serves, or of the caller's own (`own_step`); its own
    stamp where there is none."""
    stamp, keys = chosen.stamp.candidate.checkpoint.step, {key_of(h) for h in chosen.hosts}
    steps = [c.stamp.candidate.checkpoint.step for c in others
             if {key_of(h) for h in c.hosts} - keys and _weights(c) != _weights(chosen)]  # fmt: skip
    steps += [] if own_step is None else [own_step]
    if not steps or stamp <= max(steps) + STEP_LEAD:
        return stamp
    bound = max(steps) + STEP_LEAD
    logger.warning("block %d: checkpoint %s is stamped step %d, but no other key's measured checkpoint is past "
                   "step %d: taking it as step %d", chosen.stamp.host.block,
                   chosen.stamp.candidate.checkpoint.sha256[:12], stamp, max(steps), bound)  # fmt: skip
    return bound


def believable(
    measured: list[Measured], tolerance: float, uniform: float, own_loss: float | None = None
) -> list[Measured]:
    """Those of `measured` that pass (see `_believable`), compared with the best loss among the
    unsuspicious ones (a block tuned to the check cannot set the bar) and `own_loss` (the caller's
    own checkpoint's), and with `uniform` (`uniform_ce`: what knowing nothing scores); each is
    marked suspicious or not (`spot_check.suspicion`, logged), and every rejection is logged."""
    for m in measured:
        if m.judge_suspicion():
            logger.warning("block %d: the step %d checkpoint of %s is suspicious (not preferred): %s", m.host.block,
                           m.candidate.checkpoint.step, m.host.peer_id, m.suspicious)  # fmt: skip
    unsuspicious = [m for m in measured if not m.suspicious] or measured  # all suspicious: none is singled out
    losses = [m.loss for m in unsuspicious] + ([own_loss] if own_loss is not None else [])
    bar = min(filter(math.isfinite, losses), default=math.inf)  # a NaN is no loss to compare with
    return [m for m in measured if _believable(m, bar, tolerance, uniform)]


def _believable(m: Measured, best: float, tolerance: float, uniform: float) -> bool:
    """A number, close to the best measured loss, better than knowing nothing, and near what its
    hosts announce. Each test names what rejects (a NaN fails no comparison)."""
    announced = m.candidate.announced_loss()
    checks = {
        f"loss {m.loss} is not a finite number": not math.isfinite(m.loss),
        f"loss {m.loss:.3f} is more than {tolerance} above the best candidate's {best:.3f}": m.loss > best + tolerance,
        f"loss {m.loss:.3f} is worse than a uniform guess": m.loss > uniform + 0.5,
        f"loss {m.loss:.3f} is far above the {announced} its hosts announce": (
            announced is not None and m.loss > 2 * announced + 1.5
        ),
    }
    for reason, failed in checks.items():
        if failed:
            logger.warning("block %d: rejected the step %d checkpoint of %s: %s", m.host.block,
                           m.candidate.checkpoint.step, m.host.peer_id, reason)  # fmt: skip
            return False
    return True
