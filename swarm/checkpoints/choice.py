"""Which checkpoint of a block to believe: agreement among hosts, plausibility, then measured quality.

What a host announces (a step, a size, a loss) is a claim. A checkpoint is chosen on evidence:
1. Agreement. Hosts are grouped by the checkpoint they announce (step, sha256, size). DeMo
   replicas that applied the same payloads are bit-identical, so honest replicas at one step
   announce one sha256: a checkpoint vouched for by more independent hosts (distinct keys)
   ranks before one host's claim.
2. Plausibility. An announced size above what a block of this model weighs is never
   downloaded. A step far ahead of every other host's (more than twice theirs, plus
   `STEP_LEAD`) ranks after the plausible ones.
3. Measurement. Candidates are downloaded in rank order, each from all of its hosts at once
   (download.py: every chunk checked on arrival, a host that lies is dropped), and verified
   (size, sha256, block, config), then spot-checked: their `denoise_ce` on held-out windows at
   the block's own noise levels. A candidate is kept only if its loss is within `tolerance` of
   the best measured candidate's, no worse than a uniform guess, and not far worse than the loss
   its hosts announced; the first kept in rank order wins.

How many are measured depends on what a key costs (`SwarmDirectory.keys_count`, which the
callers pass on). Where keys cost something (members-only, or identity work), agreement is
evidence and the best-ranked `MEASURED_WHERE_KEYS_COUNT` are measured. In an open swarm a key
costs nothing: three Sybil keys, each announcing a different degraded copy of a block a save or
two ahead of its lone honest host, would fill those three and the honest checkpoint would never
be measured beside them (issue 27). There every candidate is measured, implausible ones too (free
keys announcing low steps can make an honest lead look implausible; they still rank last), up to
`MEASURED_AT_MOST`, and the first in rank order that passes beside all of them wins (a liar
gains at most `tolerance`). What a flood of distinct checkpoints costs: one verified download and
spot check each, at most `MEASURED_AT_MOST`, within the caller's overall time limit (swarm-fetch's
`FETCH_TIMEOUT_S`, a joiner's `JOIN_FETCH_TIMEOUT_S`), past which the choice fails (a fetch ends
with an error, a joiner starts fresh) rather than take a checkpoint unmeasured: a flood can delay
a fetch, not poison it. Left open: more distinct plausible checkpoints ranked ahead of the honest
one than the bound keep it unmeasured (`--members-only` or `--identity-work` close that).

`swarm-fetch`, a joining peer, the chaos monkey and the generation client all choose
through here (the generation client ranks hosts with `rank`, and measures a checkpoint only
one key serves, or in an open swarm every one, with `measure_candidates` and `believable`:
swarm/serving/vetting.py).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import torch
from hivemind.p2p import P2P

from swarm.checkpoints.download import download_verified, independent
from swarm.checkpoints.transfer import TransferError, max_checkpoint_bytes
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.data import Corpus, load_corpus
from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.model.evaluate import block_denoise_ce
from swarm.p2p.directory import Host
from swarm.p2p.records import CheckpointInfo

logger = logging.getLogger(__name__)

def uniform_ce(config: ModelConfig) -> float:
    """The loss of a block that knows nothing: a uniform guess over the model's units."""
    return math.log(config.vocab_size)


STEP_LEAD = 100  # a checkpoint step beyond 2 x (others' newest step) + this is implausible
SPOT_CHECK_WINDOWS = 32
MEASURED_WHERE_KEYS_COUNT = 3  # candidates measured where keys cost something: agreement ranks them
MEASURED_AT_MOST = 32  # where keys are free: every candidate, but a flood stops here


@dataclass(frozen=True)
class Candidate:
    """One checkpoint of a block and the live hosts that announce it."""

    checkpoint: CheckpointInfo
    hosts: tuple[Host, ...]
    plausible: bool

    @property
    def vouchers(self) -> int:
        """Independent hosts that announce it: distinct keys (one key is one vote, whatever it names)."""
        return independent(self.hosts)

    def announced_loss(self) -> float | None:
        """The highest training loss its hosts announce (one host cannot talk it down)."""
        losses = [h.announcement.loss for h in self.hosts if h.announcement.loss is not None and math.isfinite(h.announcement.loss)]
        return max(losses) if losses else None


def rank(hosts: list[Host], config: ModelConfig) -> list[Candidate]:
    """The checkpoints `hosts` announce, best first: plausible before implausible, then more
    vouchers, then the newest step; sizes no block of `config` can have are left out."""
    groups: dict[CheckpointInfo, list[Host]] = {}
    largest = max_checkpoint_bytes(config)
    for host in hosts:
        info = host.announcement.checkpoint
        if info is not None and info.size <= largest:
            groups.setdefault(info, []).append(host)
    candidates = [Candidate(info, tuple(group), _plausible(info, group, hosts)) for info, group in groups.items()]
    return sorted(candidates, key=lambda c: (c.plausible, c.vouchers, c.checkpoint.step), reverse=True)


def _plausible(info: CheckpointInfo, vouching: list[Host], everyone: list[Host]) -> bool:
    others = [h.announcement.step for h in everyone if h not in vouching and h.announcement.state != "joining"]
    return not others or info.step <= 2 * max(others) + STEP_LEAD


@dataclass
class SpotCheck:
    """Measures a block's loss on held-out windows at its own noise levels (fixed noise)."""

    windows: torch.Tensor
    tolerance: float = 0.1  # nats per byte a kept candidate may lose to the best measured one
    seconds: float = 0.0  # time spent measuring, in all (the defence's cost)

    @classmethod
    def from_source(cls, source: str | None, config: ModelConfig) -> "SpotCheck":
        """Held-out windows of a text source (None: the built-in corpus): the swarm's training text."""
        return cls.from_corpus(load_corpus(source), config)

    @classmethod
    def from_corpus(cls, corpus: Corpus, config: ModelConfig, count: int = SPOT_CHECK_WINDOWS) -> "SpotCheck":
        return cls(corpus.windows("validation", config).fixed(count))

    def measure(self, denoiser: Denoiser, config: ModelConfig, block: int) -> float:
        started = time.perf_counter()
        loss = block_denoise_ce(denoiser, config, block, self.windows)
        self.seconds += time.perf_counter() - started
        return loss


@dataclass
class Measured:
    """A candidate that downloaded and verified, with its spot-check loss."""

    candidate: Candidate
    data: bytes
    host: Host  # the host that served most of its bytes
    loss: float


@dataclass
class Choice:
    """The chosen checkpoint of a block, and every candidate measured on the way."""

    data: bytes
    checkpoint: CheckpointInfo
    loss: float
    chosen: Measured | None  # None: the caller's own checkpoint won
    measured: list[Measured] = field(default_factory=list)
    passed: list[Measured] = field(default_factory=list)  # those that passed the spot check (credited: ledger.py)

    @property
    def host(self) -> Host | None:
        return self.chosen.host if self.chosen else None


async def choose_checkpoint(
    p2p: P2P,
    hosts: list[Host],
    config: ModelConfig,
    block: int,
    spot_check: SpotCheck,
    own: tuple[bytes, CheckpointInfo] | None = None,
    keys_count: bool = False,
    show_progress: bool = True,
) -> Choice:
    """The checkpoint of `block` to believe (see the module docstring); `own` is a checkpoint the
    caller already trusts (its own file), measured beside the others; `keys_count`: the swarm's
    `SwarmDirectory.keys_count` (false, the default, measures more, never less). SwarmError if
    none passes."""
    candidates = rank(hosts, config)
    max_candidates = MEASURED_WHERE_KEYS_COUNT if keys_count else MEASURED_AT_MOST
    logger.info("block %d: %d hosts announce %d checkpoints (steps %s); measuring up to %d", block, len(hosts),
                len(candidates), [c.checkpoint.step for c in candidates], max_candidates)  # fmt: skip
    measured = await measure_candidates(p2p, candidates[:max_candidates], config, block, spot_check, show_progress)
    own_loss = spot_check.measure(decode_block(own[0], config, block)[0], config, block) if own else None
    passed = believable(measured, spot_check.tolerance, uniform_ce(config), own_loss)
    for m in passed:
        if own is None or m.candidate.checkpoint.step > own[1].step:
            return Choice(m.data, m.candidate.checkpoint, m.loss, m, measured, passed)
    if own is not None:
        return Choice(own[0], own[1], own_loss, None, measured, passed)
    raise SwarmError(f"block {block}: no checkpoint verified and passed the spot check ({len(measured)} measured, "
                     f"{len(hosts)} hosts)")  # fmt: skip


async def measure_candidates(p2p: P2P, candidates: list[Candidate], config: ModelConfig, block: int,
                             spot_check: SpotCheck, show_progress: bool = True) -> list[Measured]:  # fmt: skip
    """Each candidate downloaded (from all of its hosts at once), verified and measured, in order;
    those that no host served are left out."""
    measured = []
    for candidate in candidates:
        try:
            downloaded, denoiser = await download_verified(p2p, list(candidate.hosts), config, block, show_progress)
        except (TransferError, SwarmError) as error:
            logger.warning("block %d: %s; trying the next candidate", block, error)
            continue
        loss = spot_check.measure(denoiser, config, block)
        measured.append(Measured(candidate, downloaded.data, downloaded.host, loss))
    return measured


def believable(
    measured: list[Measured], tolerance: float, uniform: float, own_loss: float | None = None
) -> list[Measured]:
    """Those of `measured` that pass (see `_believable`), compared with the best loss among them,
    `uniform` (`uniform_ce`: what knowing nothing scores) and `own_loss` (the caller's own
    checkpoint's); every rejection is logged."""
    losses = [m.loss for m in measured] + ([own_loss] if own_loss is not None else [])
    best = min(filter(math.isfinite, losses), default=math.inf)  # a NaN is no loss to compare with
    return [m for m in measured if _believable(m, best, tolerance, uniform)]


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
