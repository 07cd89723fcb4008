"""The checkpoint a peer serves and names in its record: what changes at each save.

Its own record because two threads meet here: the main thread replaces it (the start state, each
save, the last save when it leaves), after the denoise service serves the new weights; the
announcer thread reads it into every record it stores (`Peer.announcement`, life.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from swarm.p2p.records import CheckpointInfo
from swarm.peer.parts import Replica

logger = logging.getLogger(__name__)


@dataclass
class Served:
    """The checkpoint it announces, when it got it, and where it came from."""

    checkpoint: CheckpointInfo | None = None
    time: float | None = None  # unix time it was saved or taken (the record's `checkpoint_time`)
    # the checkpoint it took from others when it joined, and the voices that vouched for it (its record's
    # `taken_from` while it announces that checkpoint: a voucher of its own only if two or more did)
    lineage: tuple[CheckpointInfo, tuple[str, ...]] | None = None

    def taken_from(self) -> tuple[str, ...]:
        """The voices its record names as the source of the checkpoint it announces (none: its own)."""
        return self.lineage[1] if self.lineage and self.lineage[0] == self.checkpoint else ()

    def save(self, replica: Replica) -> None:
        """Save and serve a new checkpoint; if the disk refuses (full, read-only), keep serving
        the last good one and go on training: the next save tries again."""
        trainer, store = replica.trainer, replica.store
        if self.checkpoint is not None and self.checkpoint.step == trainer.step_count:
            return
        try:
            saved = store.save(trainer.module, trainer.step_count)
        except OSError as error:
            kept = f"step {self.checkpoint.step}" if self.checkpoint else "none"
            logger.error("block %d: could not save step %d (%s); last good checkpoint kept: %s",
                         store.block, trainer.step_count, error.strerror or error, kept)  # fmt: skip
            return
        replica.denoise_service.swap_in(trainer.module, saved.sha256)  # before the record names it
        self.checkpoint, self.time = saved, time.time()
        logger.info("block %d: saved step %d (%s)", store.block, self.checkpoint.step, self.checkpoint.sha256[:12])
