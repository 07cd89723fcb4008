"""Which checkpoints of a block a generation client uses: those agreed on, or measured here.

A checkpoint is *agreed on* when hosts under two or more independent keys (distinct keys:
`swarm.checkpoints.download.independent`) announce it and answer: every answer one of them
gives can then be confirmed by another's (remote.py). A checkpoint with a single key behind it
is used only once this client has *measured* it: downloaded it through the verified download
and spot-checked it beside the block's other candidates, as swarm-fetch does
(`swarm.checkpoints.choice.measure_candidates`, `believable`). A stranger's record one step ahead of
a lone honest host is thus never used on its word: its file must download, verify and measure
about as well as the best candidate's. A checkpoint that fails is never used again by this
client. The bytes of the measured checkpoints are kept: with them a disagreement between two
replicas is settled by computing the answer here (`weights`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from hivemind.p2p import P2P

from swarm.checkpoints.choice import Candidate, Measured, SpotCheck, believable, measure_candidates, rank
from swarm.checkpoints.download import download_verified, independent
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.p2p.directory import Host
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import CheckpointInfo

logger = logging.getLogger(__name__)

MEASURED_AT_ONCE = 3  # candidates downloaded and spot-checked in one go, as swarm-fetch does
MEASURE_TIMEOUT_S = 600.0


@dataclass
class Vetting:
    """What one client knows of the checkpoints it has seen: measured and passed, or failed."""

    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    spot_check: SpotCheck | None = None  # None: the built-in corpus's held-out windows, loaded when first needed
    passed: dict[CheckpointInfo, Measured] = field(default_factory=dict)
    failed: set[CheckpointInfo] = field(default_factory=set)

    def usable(self, candidate: Candidate, answering: list[Host]) -> bool:
        """Whether the client may use `candidate`, whose hosts `answering` answer: agreed on or measured."""
        if candidate.checkpoint in self.failed or not answering:
            return False
        return independent(answering) >= 2 or candidate.checkpoint in self.passed

    def known(self, info: CheckpointInfo) -> bool:
        """Whether `info` was measured here (passed or failed)."""
        return info in self.passed or info in self.failed

    def measure(self, block: int, hosts: list[Host]) -> int:
        """Download and spot-check the best-ranked checkpoints of `block` that `hosts` announce and
        that were not measured yet, beside those of `block` that passed before: how many were
        measured now; SwarmError when none is left to measure."""
        candidates = [c for c in rank(hosts, self.config) if not self.known(c.checkpoint)][:MEASURED_AT_ONCE]
        if not candidates:
            raise SwarmError(f"block {block}: no checkpoint left that is agreed on or passes a measurement")
        logger.info("block %d: measuring %d checkpoint(s) (steps %s)", block, len(candidates),
                    [c.checkpoint.step for c in candidates])  # fmt: skip
        spot_check = self._spot_check()
        coro = measure_candidates(self.p2p, candidates, self.config, block, spot_check, show_progress=False)
        measured = self.loop.run(coro, MEASURE_TIMEOUT_S)
        earlier = [m for m in self.passed.values() if m.host.block == block]
        kept = {m.candidate.checkpoint: m for m in believable(measured + earlier, spot_check.tolerance)}
        for info in [c.checkpoint for c in candidates] + [m.candidate.checkpoint for m in earlier]:
            if info in kept:
                self.passed[info] = kept[info]
            else:
                self.reject(info, "it did not download, verify and pass the spot check beside the others")
        return len(measured)

    def weights(self, block: int, info: CheckpointInfo, hosts: list[Host]) -> Denoiser:
        """Block `block` of checkpoint `info`: the one measured here, or downloaded (verified)
        from `hosts` now; TransferError or SwarmError when none of them serves it."""
        if info in self.passed:
            return decode_block(self.passed[info].data, self.config, block)[0]
        coro = download_verified(self.p2p, hosts, self.config, block, show_progress=False)
        return self.loop.run(coro, MEASURE_TIMEOUT_S)[1]

    def reject(self, info: CheckpointInfo, why: str) -> None:
        logger.warning("checkpoint %s (step %d) will not be used: %s", info.sha256[:12], info.step, why)
        self.passed.pop(info, None)
        self.failed.add(info)

    def _spot_check(self) -> SpotCheck:
        if self.spot_check is None:
            self.spot_check = SpotCheck.from_source(None, self.config)
        return self.spot_check
