"""Measuring a block's candidate checkpoints: all at once, within one deadline, slow hosts dropped.

Each candidate is downloaded from all of its hosts (download.py: every chunk checked on arrival),
verified (size, sha256, block, config, step), and spot-checked here (spot_check.py). A stranger
with free keys can announce many distinct checkpoints (a flood); measured one after another, each
served just above the slowest rate a download tolerates, 32 of them took a fetch past its time
limit (issue 46). So:
- every candidate's download starts at once (as many as `BYTES_AT_ONCE` of announced size allow;
  the next start as slots free), and the spot checks run one at a time as downloads finish, on a
  worker thread, so the downloads go on meanwhile;
- once one download has finished, a download that has taken `SLOW_FACTOR` times as long per byte,
  plus `SLOW_GRACE_S`, is dropped as slow: a flooder must serve as fast as a quarter of the
  fastest host to be measured at all, which costs it the bandwidth an honest host spends;
- everything ends at `deadline_s` (`MEASURE_DEADLINE_S` by default): what was measured by then is
  what the choice is made from, so a flood delays a choice by at most the deadline and cannot make
  it fail while a candidate that passes was measured.
What a flood still costs: one spot check per candidate served fast (about a second each at the
built-in config), and the deadline. What it can cost an honest host: one that serves more than
`SLOW_FACTOR` times slower than the fastest candidate's hosts is dropped as slow (logged).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hivemind.p2p import P2P

from swarm.checkpoints.download import download_verified, independent, key_of
from swarm.checkpoints.spot_check import Losses, SpotCheck, weights_hash
from swarm.checkpoints.transfer import TransferError
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import Host
from swarm.p2p.records import CheckpointInfo, owner_fingerprint

logger = logging.getLogger(__name__)

MEASURE_DEADLINE_S = 300.0  # one choice's downloads and spot checks, in all
SLOW_FACTOR = 4.0  # a download this many times slower per byte than the fastest finished one ...
SLOW_GRACE_S = 10.0  # ... and this much more, is dropped as slow
BYTES_AT_ONCE = 512 * 2**20  # announced bytes downloading at once (at least two candidates)
POLL_S = 0.25  # how often running downloads are checked against the deadline and the slow limit


def voice_of(host: Host) -> str:
    """Whose word `host`'s record is on its checkpoint: its key's (fingerprint), or the one voice its
    record says it took that checkpoint from (`BlockAnnouncement.taken_from`). An honest key that
    adopted a stranger's block serves it bit for bit; counted as a voucher of its own, it would
    launder the stranger's word into agreement (issue 46)."""
    taken = host.announcement.taken_from
    return taken[0] if len(taken) == 1 else owner_fingerprint(key_of(host))


def voices(hosts: Sequence[Host]) -> set[str]:
    """The distinct voices of `hosts` (`voice_of`)."""
    return {voice_of(h) for h in hosts}


def vouchers_among(hosts: Sequence[Host]) -> int:
    """Independent vouchers among `hosts`: distinct voices, and never more than distinct keys (one key's
    records cannot name two sources to count twice)."""
    return min(len(voices(hosts)), independent(hosts))


@dataclass(frozen=True)
class Candidate:
    """One checkpoint of a block and the live hosts that announce it; `backed`: a host's key has credit in
    the swarm's ledger (swarm/p2p/ledger.py `backed_keys`), so it is measured before unbacked ones."""

    checkpoint: CheckpointInfo
    hosts: tuple[Host, ...]
    plausible: bool
    backed: bool = False

    @property
    def vouchers(self) -> int:
        """Independent hosts that announce it (`vouchers_among`): one key is one vote, whatever it names, and
        a host that took it from one key alone is that key's vote."""
        return vouchers_among(self.hosts)

    def announced_loss(self) -> float | None:
        """The highest training loss its hosts announce (one host cannot talk it down)."""
        losses = [
            h.announcement.loss
            for h in self.hosts
            if h.announcement.loss is not None and math.isfinite(h.announcement.loss)
        ]
        return max(losses) if losses else None


@dataclass
class Measured:
    """A candidate that downloaded and verified, with what the spot check measured of it."""

    candidate: Candidate
    data: bytes
    host: Host  # the host that served most of its bytes
    loss: float  # the spot check's score (`Losses.score`)
    losses: Losses | None = None  # per source
    weights: str = ""  # the sha256 of its decoded tensors (`weights_hash`): one for the same weights under any stamp
    suspicious: str | None = None  # why its losses look tuned to the check (`believable` sets it)


async def measure_candidates(p2p: P2P, candidates: list[Candidate], config: ModelConfig, block: int,
                             spot_check: SpotCheck, show_progress: bool = False,
                             deadline_s: float = MEASURE_DEADLINE_S) -> list[Measured]:  # fmt: skip
    """The candidates downloaded, verified and measured (see the module docstring), in their given
    order; those no host served in time, or too slowly, are left out (and logged)."""
    if not candidates:
        return []
    run = _Measuring(p2p, config, block, spot_check, show_progress, deadline_s)
    largest = max(c.checkpoint.size for c in candidates)
    slots = asyncio.Semaphore(max(2, BYTES_AT_ONCE // max(1, largest)))
    results = await asyncio.gather(*(run.one(candidate, slots) for candidate in candidates))
    return [m for m in results if m is not None]


class _Measuring:
    """One round of measurements: the shared deadline, the fastest download so far, the check lock."""

    def __init__(self, p2p: P2P, config: ModelConfig, block: int, spot_check: SpotCheck, show_progress: bool,
                 deadline_s: float):  # fmt: skip
        self.p2p, self.config, self.block, self.spot_check = p2p, config, block, spot_check
        self.show_progress = show_progress
        self.loop = asyncio.get_running_loop()
        self.stop_at = self.loop.time() + deadline_s
        self.fastest: float | None = None  # seconds per byte of the fastest download that finished
        self.checking = asyncio.Lock()  # spot checks one at a time: they share the machine's cores

    async def one(self, candidate: Candidate, slots: asyncio.Semaphore) -> Measured | None:
        async with slots:
            downloaded = await self._download(candidate)
        if downloaded is None:
            return None
        (served, denoiser) = downloaded
        async with self.checking:
            if self.loop.time() >= self.stop_at:
                logger.warning("block %d: no time left to measure step %d (%s)", self.block, candidate.checkpoint.step,
                               candidate.checkpoint.sha256[:12])  # fmt: skip
                return None
            losses = await self.loop.run_in_executor(None, self.spot_check.losses, denoiser, self.config, self.block)
        return Measured(candidate, served.data, served.host, losses.score, losses, weights_hash(denoiser))

    async def _download(self, candidate: Candidate) -> tuple | None:
        """The candidate's download and block, or None (logged) if it failed, was slow or ran past the deadline."""
        info, begun = candidate.checkpoint, self.loop.time()
        task = asyncio.ensure_future(download_verified(self.p2p, list(candidate.hosts), self.config, self.block,
                                                       self.show_progress))  # fmt: skip
        try:
            why = await self._watch(task, info, begun)
        finally:  # dropped, or the whole measurement cancelled by its caller: no download goes on unwatched
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if why is not None:
            logger.warning("block %d: dropped step %d (%s) from %s: its download %s", self.block, info.step,
                           info.sha256[:12], sorted(h.peer_id for h in candidate.hosts)[:3], why)  # fmt: skip
            return None
        try:
            result = task.result()
        except (TransferError, SwarmError) as error:
            logger.warning("block %d: %s; trying the next candidate", self.block, error)
            return None
        rate = (self.loop.time() - begun) / max(1, info.size)
        self.fastest = rate if self.fastest is None else min(self.fastest, rate)
        return result

    async def _watch(self, task: asyncio.Future, info: CheckpointInfo, begun: float) -> str | None:
        """Wait for a download; why it must be dropped (slow, or past the deadline), or None once it is done."""
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            now = self.loop.time()
            if task.done():
                return None
            if now >= self.stop_at:
                return "ran past the measurement deadline"
            if self.fastest is not None and now - begun > SLOW_FACTOR * self.fastest * info.size + SLOW_GRACE_S:
                return (
                    f"was slow: {now - begun:.0f}s, against {self.fastest * info.size:.1f}s at the fastest host's rate"
                )
        return None
