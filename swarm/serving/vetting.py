"""Which checkpoints of a block a generation client uses: those agreed on, or measured here.

A checkpoint is *agreed on* when two or more independent voices (distinct keys, a host that took
it from one key alone being that key's: `swarm.checkpoints.measure.vouchers_among`) announce it and
answer: every answer one of them gives can then be confirmed by another's (cross_check.py). Agreement counts
only where keys cost something (a members-only swarm, or one that prices an identity with work); in an open swarm
at the defaults every checkpoint is measured (`SwarmDirectory.keys_count` says why). A checkpoint
with a single key behind it is used only once this client has *measured* it: downloaded it through the verified download
and spot-checked it beside the block's other candidates, as swarm-fetch does
(`swarm.checkpoints.choice.measure_candidates`, `believable`). A stranger's record one step ahead of
a lone honest host is thus never used on its word: its file must download, verify and measure
about as well as the best candidate's.

A checkpoint that downloaded and failed the spot check is never used again by this client: its
bytes are fixed by its sha256, so measuring it again would only cost another download. One that
no host served, or whose download ran out of time, failed *for now* and is measured again after
`RETRY_AFTER_S`: a busy or briefly unreachable host (which a stranger can cause) must not make a
lone honest host's block unusable for the client's life. Each candidate has its own time limit,
so that one slow download fails that candidate, not the whole choice.

What is remembered is bounded (`REMEMBERED`, each of passed and failed): a stranger can
announce any number of checkpoints that fail, and must not make the client's memory grow with
them. Past the bound, checkpoints whose failure has run out go first, then the oldest; one
forgotten that was bad for good is measured, and caught, again if it comes back.

Of the measured checkpoints only the losses are kept, and one decoded file per block (the
best-ranked that passed, or the last fetched by `weights`): with it a disagreement, or an
answer no other key can confirm, is settled by computing the answer here, without keeping
every passed file of the session in memory.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from hivemind.p2p import P2P

from swarm.checkpoints.choice import (
    MEASURED_AT_MOST,
    Candidate,
    Checkpoint,
    Measured,
    SpotCheck,
    believable,
    by_evidence,
    measure_candidates,
    rank,
    uniform_ce,
)
from swarm.checkpoints.download import download_verified
from swarm.checkpoints.measure import vouchers_among
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.p2p.directory import Host
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import CheckpointInfo

logger = logging.getLogger(__name__)

MEASURED_AT_ONCE = MEASURED_AT_MOST  # candidates downloaded and spot-checked in one go, all at once (measure.py)
MEASURE_TIMEOUT_S = 300.0  # one round of measurements (its deadline), or one download for `weights`
RETRY_AFTER_S = 120.0  # before a checkpoint that no host served (in time) is measured again
REMEMBERED = 1024  # checkpoints kept in each of `passed` and `failed`


@dataclass
class Vetting:
    """What one client knows of the checkpoints it has seen: measured and passed, or failed."""

    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    spot_check: SpotCheck | None = None  # None: the built-in corpus's held-out windows, loaded when first needed
    passed: dict[CheckpointInfo, Measured] = field(default_factory=dict)  # without their bytes (see `_held`)
    failed: dict[CheckpointInfo, float] = field(default_factory=dict)  # until when (monotonic; inf: for good)
    _held: dict[int, tuple[CheckpointInfo, Denoiser]] = field(default_factory=dict)  # one file per block

    def usable(self, candidate: Candidate, answering: list[Host], keys_count: bool = True) -> bool:
        """Whether the client may use `candidate`, whose hosts `answering` answer: measured, or agreed
        on where `keys_count` (keys cost something: `SwarmDirectory.keys_count`)."""
        if self._failed(candidate.checkpoint) or not answering:
            return False
        return (keys_count and vouchers_among(answering) >= 2) or candidate.checkpoint in self.passed

    def known(self, info: CheckpointInfo) -> bool:
        """Whether `info` was measured here (passed, or failed and not due for another try)."""
        return info in self.passed or self._failed(info)

    def measure(self, block: int, hosts: list[Host]) -> int:
        """Download and spot-check the best-ranked checkpoints of `block` that `hosts` announce and
        that were not measured yet, all at once within `MEASURE_TIMEOUT_S` (measure.py: slow hosts
        dropped), beside those of `block` that passed before: how many were measured now;
        SwarmError when none is left to measure."""
        candidates = [c for c in rank(hosts, self.config) if not self.known(c.checkpoint)][:MEASURED_AT_ONCE]
        if not candidates:
            raise SwarmError(f"block {block}: no checkpoint left that is agreed on or passes a measurement")
        logger.info("block %d: measuring %d checkpoint(s) (steps %s)", block, len(candidates),
                    [c.checkpoint.step for c in candidates])  # fmt: skip
        spot_check = self._spot_check()
        coro = measure_candidates(self.p2p, candidates, self.config, block, spot_check, False, MEASURE_TIMEOUT_S)
        try:
            measured = self.loop.run(coro, MEASURE_TIMEOUT_S + 30)
        except TimeoutError:  # the deadline is the measurement's own; this is a last resort
            logger.warning("block %d: measuring %d checkpoint(s) ran past %.0fs", block, len(candidates),
                           MEASURE_TIMEOUT_S)
            measured = []
        earlier = [m for m in self.passed.values() if m.host.block == block]
        passed = believable(measured + earlier, spot_check.tolerance, uniform_ce(self.config))
        kept = {m.candidate.checkpoint: m for m in passed}
        served = {m.candidate.checkpoint for m in measured}
        for info in [c.checkpoint for c in candidates] + [m.candidate.checkpoint for m in earlier]:
            if info in kept:
                self.passed[info] = replace(kept[info], data=b"")
                self.failed.pop(info, None)
                _forget_oldest(self.passed, REMEMBERED)
            elif info in served or info in self.passed:
                self.reject(info, "it did not pass the spot check beside the others")
            else:
                self.reject(info, "no host served it in time", RETRY_AFTER_S)
        ordered = by_evidence([m for m in measured if m.candidate.checkpoint in kept], keys_count=False)
        if ordered:  # the file of the best measured now, to settle disagreements with
            best = ordered[0].stamp
            self._held[block] = best.candidate.checkpoint, decode_block(best.data, self.config, block)[0]
        return len(measured)

    def ordered(self, block: int, infos: list[CheckpointInfo]) -> list[Checkpoint]:
        """Those of `infos` (checkpoints of `block`) that passed here, as checkpoints (the same weights
        under any stamp are one), best first (`by_evidence`, where keys are free: the loss decides)."""
        passed = [self.passed[info] for info in infos if info in self.passed and not self._failed(info)]
        return by_evidence([m for m in passed if m.host.block == block], keys_count=False)

    def weights(self, block: int, info: CheckpointInfo, hosts: list[Host]) -> Denoiser:
        """Block `block` of checkpoint `info`: the file held here, or downloaded (verified) from
        `hosts` now and held in place of the block's last one (so it is downloaded once while it is
        in use); TransferError, SwarmError or TimeoutError when none of them serves it in time."""
        if (held := self._held.get(block)) is None or held[0] != info:
            coro = download_verified(self.p2p, hosts, self.config, block, show_progress=False)
            self._held[block] = info, self.loop.run(coro, MEASURE_TIMEOUT_S)[1]
        return self._held[block][1]

    def reject(self, info: CheckpointInfo, why: str, seconds: float = float("inf")) -> None:
        """Use `info` no more: for good, or for `seconds` where it may have failed for a reason of the moment."""
        logger.warning("checkpoint %s (step %d) will not be used%s: %s", info.sha256[:12], info.step,
                       "" if seconds == float("inf") else f" for {seconds:.0f}s", why)  # fmt: skip
        self.passed.pop(info, None)
        self._held = {block: held for block, held in self._held.items() if held[0] != info}
        until = max(self.failed.pop(info, 0.0), time.monotonic() + seconds)  # popped: now the newest
        now = time.monotonic()
        if len(self.failed) >= REMEMBERED:
            self.failed = {i: t for i, t in self.failed.items() if t > now}
        self.failed[info] = until
        _forget_oldest(self.failed, REMEMBERED)

    def _failed(self, info: CheckpointInfo) -> bool:
        return self.failed.get(info, 0.0) > time.monotonic()

    def _spot_check(self) -> SpotCheck:
        if self.spot_check is None:
            self.spot_check = SpotCheck.from_source(None, self.config)
        return self.spot_check


def _forget_oldest(remembered: dict, bound: int) -> None:
    """Drop the first-inserted entries of `remembered` until it holds at most `bound`."""
    for info in list(remembered)[: max(0, len(remembered) - bound)]:
        del remembered[info]
