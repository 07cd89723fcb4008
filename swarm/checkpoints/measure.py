"""Measuring a block's candidate checkpoints: all at once, within one deadline, slow downloads dropped.

Each candidate is downloaded from its hosts (download.py: every chunk checked on arrival),
verified (size, sha256, block, config, step), and spot-checked here (spot_check.py). A stranger
with free keys can announce many distinct checkpoints (a flood); measured one after another, each
served just above the slowest rate a download tolerates, 32 of them took a fetch past its time
limit (issue 46). So:
- every candidate's download starts at once (as many as `BYTES_AT_ONCE` of announced size allow;
  the next start as slots free), and the spot checks run one at a time as downloads finish, on a
  worker thread, so the downloads go on meanwhile;
- a download is judged by the bytes it delivers, not by the time it has taken (`_Measuring._slow`).
  Once one download has finished, at F bytes a second from its first chunk list to its end (the
  fastest so far), another is dropped as slow when the bytes it has verified fall short of what
  F / `SLOW_FACTOR` delivers in the time since its own first chunk list came in, less
  `SLOW_GRACE_S`. So a download that verifies nothing is dropped `SLOW_GRACE_S` after its list
  came in, one that verifies bytes at well under F / `SLOW_FACTOR` soon after, and a flooder must
  serve as fast as a quarter of the fastest host to be measured at all, which costs it the
  bandwidth an honest host spends. A download that verifies bytes at F / `SLOW_FACTOR` or more is
  never dropped as slow, however late its list came, nor is one that has finished and verified:
  none is dropped in favour of one that was merely faster. The wait for a first chunk list is not
  counted against a download: each host answers within `FIRST_BYTE_TIMEOUT_S`, busy tries
  included, and all are asked at once (transfer.py, download.py), so hosts that hold their lists
  cost that once. The rule before (a download dropped once it had taken `SLOW_FACTOR` times as
  long per byte as the fastest, plus `SLOW_GRACE_S`) counted that wait: a lone honest host's
  download held by a stranger's chunk list was dropped beside a poison served at full speed,
  which, measured alone, passed (issue 57);
- everything ends at `deadline_s` (`MEASURE_DEADLINE_S` by default): what was measured by then is
  what the choice is made from, so a flood delays a choice by at most the deadline and cannot make
  it fail while a candidate that passes was measured.
What a flood still costs: one spot check per candidate served fast (about a second each at the
built-in config), and the deadline. What it can cost an honest host: one whose download verifies
bytes at under 1 / `SLOW_FACTOR` of the fastest candidate's rate is dropped as slow (logged).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hivemind.p2p import P2P

from swarm.checkpoints.download import Progress, download_verified, independent, key_of
from swarm.checkpoints.spot_check import Losses, SpotCheck, suspicion, weights_hash
from swarm.checkpoints.transfer import TransferError
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import Host
from swarm.p2p.records import CheckpointInfo, owner_fingerprint

logger = logging.getLogger(__name__)

MEASURE_DEADLINE_S = 300.0  # one choice's downloads and spot checks, in all
SLOW_FACTOR = 4.0  # a download verifying bytes this many times slower than the fastest finished one ...
SLOW_GRACE_S = 10.0  # ... from this long after its first chunk list came in, is dropped as slow
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
    suspicious: str | None = None  # why its losses look tuned to the check (`judge_suspicion` sets it)

    def judge_suspicion(self) -> str | None:
        """Why its losses look tuned to the check rather than learnt (`spot_check.suspicion`), or None;
        kept in `suspicious`. A fetch prefers others to it (choice.py), a merge leaves it out (reconcile.py)."""
        self.suspicious = suspicion(self.losses) if self.losses is not None else None
        return self.suspicious


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
        self.fastest: float | None = None  # bytes a second, from its first chunk list, of the fastest download finished
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
        info, progress = candidate.checkpoint, Progress()
        task = asyncio.ensure_future(download_verified(self.p2p, list(candidate.hosts), self.config, self.block,
                                                       self.show_progress, progress))  # fmt: skip
        try:
            why = await self._watch(task, progress)
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
        listed_at = self.loop.time() if progress.listed_at is None else progress.listed_at  # a finished one had a list
        rate = info.size / max(self.loop.time() - listed_at, POLL_S)  # timed no finer than it is watched
        self.fastest = rate if self.fastest is None else max(self.fastest, rate)
        return result

    async def _watch(self, task: asyncio.Future, progress: Progress) -> str | None:
        """Wait for a download; why it must be dropped (slow, or past the deadline), or None once it is done."""
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            now = self.loop.time()
            if task.done():
                return None
            if now >= self.stop_at:
                return "ran past the measurement deadline"
            if (slow := self._slow(progress, now)) is not None:
                return slow
        return None

    def _slow(self, progress: Progress, now: float) -> str | None:
        """Why a running download is slow, or None: it has verified fewer bytes than 1 / `SLOW_FACTOR` of
        the fastest finished download's rate delivers in the time since its first chunk list came in,
        less `SLOW_GRACE_S` (the module docstring says why). Not before a download has finished, nor
        before its own first list is in."""
        if self.fastest is None or progress.listed_at is None:
            return None
        fetching = now - progress.listed_at
        due = (fetching - SLOW_GRACE_S) * self.fastest / SLOW_FACTOR
        if progress.verified >= due:
            return None
        return (f"was slow: {progress.verified} bytes verified in {fetching:.0f}s since its first chunk list, "
                f"under 1/{SLOW_FACTOR:g} of the fastest download's {self.fastest / 1e3:.0f} kB/s "
                f"after {SLOW_GRACE_S:g}s")  # fmt: skip
