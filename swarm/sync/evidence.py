"""Who contradicts whom: the record, kept over the rounds, that DeMo and outer steps judge senders by.

Each round every pair of senders is compared on what the strategy can check (DeMo: the signs
of the DCT coefficients both sent; of two senders, DeMo and outer steps: how much of the larger
update their step keeps, `kept_share`, in a record of its own) and the record adds up, per
pair, what they agreed on and what could be compared, the rounds before weighing `decay` less
per round. A pair is contradicting once, so counted, at least `min_shared` could be compared
and at most `contradicted_at` of it agreed. The record follows from the sets a replica
applied alone, so replicas that applied the same sets judge the same way.

Who then counts: of three senders or more, every one but those a strict majority of the others
contradict (unless that leaves no majority: then all), this replica itself (`own`) included:
replicas that agree among themselves leave out the one they contradict, and it must leave itself
out too, or it applies other sets than they do and drifts from them (counted in always, a
replica that dozed and came back with momentum of its own did: tests/test_sync.py). Of two,
neither can outvote the other: both count until the pair contradicts, then only `own`, this
replica itself (the other may be the honest one: each replica steps on its own, which no
stranger can freeze).

Of three or more, what those that count add up to, own among them or not, must also keep some of
own's update (`keeps_own`): in an open swarm keys are free, and two keys that send nothing (a
payload that decodes to zero) or own's update negated were a majority of a lone replica's vote,
which then froze it, or stepped it up its loss, every step (issue 57). Each round adds to a
record (the pair of own and `THE_VOTE`) how much of own's update the vote keeps (`kept_of_own`:
the share of own's sizes that their agreeing minimum keeps, or the cosine of the angle between
them, whichever is smaller); once its mean over the rounds remembered is at most
`contradicted_at`, this replica steps on its own update alone. The same test as two senders'
`kept_share`, with the vote in the other's place. What it does not stop: keys that leave own a
little more than that, reshaping the rest (docs/trust.md).

What the updates of those that count add up to, coordinate by coordinate, is here too:
`majority_mean` and, of two senders, `agreeing_minimum` (DeMo's step and the outer step each
say when they take which).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

THE_VOTE = "(the vote)"  # in a record, what those that count make together (no peer id is this): `keeps_own`
FORGOTTEN_BELOW = 0.01  # a pair's record is dropped once its compared count has decayed below this (senders gone)
Record = dict[tuple[str, str], tuple[float, float]]  # per pair of senders (sorted): agreed and compared, decayed
Comparison = Callable[[int, int], tuple[float, float]]  # senders i, j: what they agreed on, what was compared
Updates = Mapping[Hashable, torch.Tensor]  # one sender's update, in parts (by parameter, or by group of them)


@dataclass
class Evidence:
    """One replica's record and the thresholds it judges by (module docstring)."""

    min_shared: float
    contradicted_at: float
    decay: float
    record: Record = field(default_factory=dict)

    def judged(self, senders: Sequence[str], compare: Comparison, own: str) -> tuple[list[int], Record]:
        """The positions of the senders that count, and the record with this round's counts in
        (the caller keeps it: this leaves the record as it was). `compare(i, j)`: what the
        senders at positions i and j agreed on this round, and what could be compared."""
        record = {pair: (agreed * self.decay, shared * self.decay) for pair, (agreed, shared) in self.record.items()
                  if shared * self.decay >= FORGOTTEN_BELOW}  # fmt: skip
        if len(senders) < 2 or len(set(senders)) != len(senders):
            return list(range(len(senders))), record
        contradicted = [0] * len(senders)
        for i, j in itertools.combinations(range(len(senders)), 2):
            pair = tuple(sorted((senders[i], senders[j])))
            agreed, shared = record.get(pair, (0.0, 0.0))
            now_agreed, now_shared = compare(i, j)
            agreed, shared = agreed + now_agreed, shared + now_shared
            record[pair] = (agreed, shared)
            if shared >= self.min_shared and agreed <= self.contradicted_at * shared:
                contradicted[i] += 1
                contradicted[j] += 1
        if len(senders) == 2:
            return ([senders.index(own)] if contradicted[0] and own in senders else [0, 1]), record
        others = len(senders) - 1
        kept = [i for i, count in enumerate(contradicted) if 2 * count <= others]
        return (kept if 2 * len(kept) > len(senders) else list(range(len(senders)))), record

    def keeps_own(self, own: str, share: float) -> tuple[bool, Record]:
        """Whether the vote of three senders or more counts, with this round's `share` of own's
        update that it keeps (`kept_of_own`) in the record (kept by the caller, as in `judged`):
        not once the mean share over the rounds remembered is at most `contradicted_at`."""
        kept, record = self.judged([own, THE_VOTE], lambda i, j: (share, 1.0), own)
        return len(kept) == 2, record


def majority_mean(changes: list[torch.Tensor]) -> torch.Tensor:
    """The mean of the replicas' values, clipped coordinate-wise into [v(n-m+1), v(m)] of the n sorted
    values, m = n // 2 + 1 (`majority_range`): wherever a strict majority moves a coordinate one way
    the result goes that way, and with fewer than half of them hostile both ends are values an
    honest replica sent (why: swarm/sync/pseudo_gradient.py's docstring). Of one: that one; of
    two: their mean."""
    low, high = majority_range(changes)
    mean = changes[0].clone()  # summed in place, in order: stacking them would copy them all
    for change in changes[1:]:
        mean.add_(change)
    return mean.div_(len(changes)).clamp_(low, high)


def majority_range(changes: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinate-wise v(n-m+1) and v(m) of the n sorted values, m = n // 2 + 1: the range a strict
    majority spans. Of three, the median; of four, the middle two: of each pair's smaller and
    larger, the larger smaller one and the smaller larger one (8 passes where the sort takes 12,
    and the vote of a block's replicas is mostly such passes); of more, from the sort."""
    n = len(changes)
    if n == 3:
        a, b, c = changes
        median = torch.maximum(torch.minimum(a, b), torch.minimum(torch.maximum(a, b), c))
        return median, median
    if n == 4:
        a, b, c, d = changes
        larger_low = torch.maximum(torch.minimum(a, b), torch.minimum(c, d))
        smaller_high = torch.minimum(torch.maximum(a, b), torch.maximum(c, d))
        return torch.minimum(larger_low, smaller_high), torch.maximum(larger_low, smaller_high)
    ordered = sorted_coordinatewise(changes)
    majority = n // 2 + 1
    return ordered[n - majority], ordered[majority - 1]


def sorted_coordinatewise(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """The values sorted coordinate by coordinate, smallest first: an odd-even transposition sort,
    n rounds of min and max of neighbours over whole tensors. For the handful of replicas a round
    has it is several times faster than `torch.sort` along a stacked dimension, which sorts each
    coordinate's short column apart (4 replicas of 4 M values: 32 against 108 ms on 2 cores)."""
    ordered = list(values)
    for round_ in range(len(ordered)):
        for i in range(round_ % 2, len(ordered) - 1, 2):
            low, high = ordered[i], ordered[i + 1]
            ordered[i], ordered[i + 1] = torch.minimum(low, high), torch.maximum(low, high)
    return ordered


def agreeing_minimum(changes: Sequence[torch.Tensor]) -> torch.Tensor:
    """Of two senders' values, coordinate-wise: where both go the same way, the smaller; 0 elsewhere
    (the unanimity of two senders: neither moves a coordinate further than, or another way than, the other)."""
    a, b = changes
    return torch.where(a.sign() == b.sign(), a.sign() * torch.minimum(a.abs(), b.abs()), 0.0)


def kept_of_own(vote: Updates, own: Updates) -> float:
    """How much of own's update the vote keeps, out of 1 (own all zero: all of it): the smaller of
    the share of own's sizes, summed over its coordinates, that their agreeing minimum keeps, and
    the cosine of the angle between the vote and own (0 for a vote of zeros). Each sees what the
    other misses: own with the signs of its largest values flipped keeps much of its coordinates
    (the small ones), yet points against it; own shrunk a millionfold points its way, yet keeps
    nothing. The angle, not how far the vote goes along own: a vote of many honest DeMo replicas
    is small where only own sent a coefficient (8 replicas of the small block: it went 0.08 of own's
    length along it, at an angle whose cosine was 0.25 or more: benchmarks/sync_vote.py)."""
    kept = sum(agreeing_minimum([vote[part], own[part]]).abs().sum(dtype=torch.float64) for part in own)
    size = sum(own[part].abs().sum(dtype=torch.float64) for part in own)
    along = sum((vote[part].double() * own[part].double()).sum() for part in own)
    squares = [sum(u[part].double().pow(2).sum() for part in own) for u in (vote, own)]
    cosine = float(along / (squares[0] * squares[1]).sqrt()) if squares[0] * squares[1] > 0 else 0.0
    return min(float(kept / size), cosine) if size > 0 else 1.0


def kept_share(a: Updates, b: Updates) -> tuple[float, float]:
    """A round of two senders in the record: the share of the larger update (sizes summed over
    every coordinate) that their agreeing minimum keeps, out of 1 (both zero: all of it)."""
    kept = sum(agreeing_minimum([a[part], b[part]]).abs().sum(dtype=torch.float64) for part in a)
    larger = max(sum(u[part].abs().sum(dtype=torch.float64) for part in u) for u in (a, b))
    return (float(kept / larger) if larger > 0 else 1.0), 1.0
