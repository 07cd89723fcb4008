"""Checking one voice's answers at a rate nobody can predict (issues 46 and 57).

A checkpoint that only one key serves has no witness: no other replica can confirm its host's
answers. In an open swarm, where a key costs nothing, a checkpoint that many keys serve is no
better: they may all be one stranger's, and their agreement proves nothing, so there the keys of a
checkpoint are one voice, checked at this same rate whatever their number (cross_check.py); every
key is asked each time, so keys that lie together are caught, and banned, together. The client has
measured the checkpoint (vetting.py), so its weights are good and their verified file is held here,
but its hosts may still answer with other weights. Checking every answer would mean
computing every step of the block here, and the host would be of no use; checking none lets it lie
freely. So each of its answers is checked with probability `rate`: the client computes the block's
steps itself and compares (cross_check.py), and a host shown wrong is banned for the runner's life.

The draw is private: it comes from the operating system's randomness, one per answer, after the
answer arrives, and the request is the same whether or not it will be checked. A host cannot tell
which answers are checked, so it cannot lie only where it is not. Whatever share of its answers it
corrupts, the lies used before its first checked one are a geometric count with mean
(1 - rate) / rate (`expected_lies_before_ban`): 3 at the default 0.25. Then its key is worthless
to this client for good, and the lie that was checked is replaced by the answer computed here. To
lie at all it had to serve a checkpoint that measured well here, under a key of its own: each
further key buys on average 3 corrupted answers of one block, against one download and spot check.

What it costs the client: `rate` of the voice's requests computed here too (one block's steps,
`CrossCheckStats.lone_checked`), on the file it already holds; an honest host loses nothing, and
is credited in the ledger for each answer checked (only checked answers are, in an open swarm).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

AUDIT_RATE = 0.25  # share of a lone key's answers checked here


@dataclass
class LoneKeyAudit:
    """Whether to check the answer just received from a checkpoint's lone key."""

    rate: float = AUDIT_RATE
    draws: random.Random = field(default_factory=random.SystemRandom)  # private: tests may seed their own

    def __post_init__(self) -> None:
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"an audit rate must be in (0, 1], not {self.rate}")

    def check_this_one(self) -> bool:
        return self.draws.random() < self.rate

    @property
    def expected_lies_before_ban(self) -> float:
        """Mean answers a host that lies every time gets used before its first checked one."""
        return (1.0 - self.rate) / self.rate
