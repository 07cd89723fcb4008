"""Checking a lone key's answers at a rate nobody can predict (issue 46).

A checkpoint that only one key serves has no witness: no other replica can confirm its host's
answers. The client has measured it (vetting.py), so its weights are good and their verified file
is held here, but the host may still answer with other weights. Checking every answer would mean
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

What it costs the client: `rate` of the lone key's requests computed here too (one block's steps,
`CrossCheckStats.lone_checked`), on the file it already holds; an honest host loses nothing.
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
