"""Who contradicts whom: the record, kept over the rounds, that DeMo and outer steps judge senders by.

Each round pairs of senders are compared on what the strategy can check (DeMo: the signs of
the DCT coefficients both sent; DeMo and outer steps: how much of the larger update their
agreeing minimum keeps, `kept_share`, in a record of its own) and the record adds up, per
pair, what they agreed on and what could be compared, the rounds before weighing `decay` less
per round. A pair is contradicting once, so counted, at least `min_shared` could be compared
and at most `contradicted_at` of it agreed. The record follows from the sets a replica
applied alone, so replicas that applied the same sets judge the same way.

Who then counts depends on what a key costs (`SwarmDirectory.keys_count`, which the peer hands
the strategy as its config's `keys_count`):
- anchored on `own`, this replica itself, in an open swarm (keys free), and of two senders
  anywhere: own counts, and each other sender unless the pair it makes with own contradicts
  (only those pairs are compared). Two keys are free: two strangers that fetch a lone honest
  replica's payload (`rpc_payload` serves anyone) and send it negated contradict it two to
  one, so a count of senders would have them outvote it and step it up its loss every step
  (issue 57); compared with own they leave instead. Of two senders, neither can outvote the
  other, so the rule is the same in every swarm.
- by majority where keys count (members-only swarms, or identities priced with work): of
  three senders or more, every one but those a strict majority of the others contradict
  (unless that leaves no majority: then all). There a majority of keys is a majority of the
  creator's members (or of paid work), which is what the vote assumes; every pair is compared.

What the updates of those that count add up to, coordinate by coordinate, is here too:
`majority_mean` (the majority's rule) and `agreeing_minimum` (the anchored rule: a coordinate
moves only where every one that counts moves it the same way, by the smallest; own counts, so
no other sender moves a coordinate further than, or another way than, this replica's own
update). The strategies (decoupled_momentum.py, pseudo_gradient.py) say when they take which,
and what the anchored rule costs an honest group.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

THE_OTHERS = "(the others)"  # in a record, what the others that vote beside own make together (no peer id)
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

    def judged(self, senders: Sequence[str], compare: Comparison, own: str,
               anchored: bool = False) -> tuple[list[int], Record]:  # fmt: skip
        """The positions of the senders that count, and the record with this round's counts in
        (the caller keeps it: this leaves the record as it was). `compare(i, j)`, i < j: what the
        senders at positions i and j agreed on this round, and what could be compared.
        `anchored`: own's rule (module docstring) whatever the number of senders; of two senders
        it is the rule anyway."""
        record = {pair: (agreed * self.decay, shared * self.decay) for pair, (agreed, shared) in self.record.items()
                  if shared * self.decay >= FORGOTTEN_BELOW}  # fmt: skip
        if len(senders) < 2 or len(set(senders)) != len(senders):
            return list(range(len(senders))), record
        if anchored or len(senders) == 2:
            return self._beside(senders, compare, own, anchored, record), record
        contradicted = [0] * len(senders)
        for i, j in itertools.combinations(range(len(senders)), 2):
            if self._contradicting(senders, i, j, compare, record):
                contradicted[i] += 1
                contradicted[j] += 1
        others = len(senders) - 1
        kept = [i for i, count in enumerate(contradicted) if 2 * count <= others]
        return (kept if 2 * len(kept) > len(senders) else list(range(len(senders)))), record

    def _beside(self, senders: Sequence[str], compare: Comparison, own: str, anchored: bool,
                record: Record) -> list[int]:  # fmt: skip
        """Own's rule: own, and every other sender whose pair with own does not contradict. Without
        own among the senders there is nothing to anchor on: of two senders both count (where keys
        count), in an open swarm nobody does (the others alone would be strangers' step)."""
        if own not in senders:
            return [] if anchored else list(range(len(senders)))
        mine = senders.index(own)
        beside = [j for j in range(len(senders)) if j != mine
                  and not self._contradicting(senders, min(mine, j), max(mine, j), compare, record)]  # fmt: skip
        return sorted([mine, *beside])

    def _contradicting(self, senders: Sequence[str], i: int, j: int, compare: Comparison, record: Record) -> bool:
        """Add this round's comparison of senders i < j to `record`; whether the pair now contradicts."""
        pair = tuple(sorted((senders[i], senders[j])))
        agreed, shared = record.get(pair, (0.0, 0.0))
        now_agreed, now_shared = compare(i, j)
        agreed, shared = agreed + now_agreed, shared + now_shared
        record[pair] = (agreed, shared)
        return shared >= self.min_shared and agreed <= self.contradicted_at * shared


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
    """Of the senders' values, coordinate-wise: where all go the same way, the smallest; 0 elsewhere
    (their unanimity: none moves a coordinate further than, or another way than, any other).
    Of one: its values; of two, `where(signs equal, sign * smaller, 0)`; associative, so the
    agreeing minimum of own and the others' agreeing minimum is that of them all."""
    first, *rest = changes
    if not rest:
        return first.clone()
    sign, smallest = first.sign(), first.abs()
    for change in rest:
        smallest = torch.minimum(smallest, change.abs())
        sign = torch.where(change.sign() == sign, sign, 0.0)
    return sign.mul_(smallest)


def size(update: Updates) -> torch.Tensor:
    """An update's size: its values' absolute sum over every part, in float64."""
    return sum((part.abs().sum(dtype=torch.float64) for part in update.values()), torch.zeros((), dtype=torch.float64))


def share_kept(kept: float, sizes: Sequence[float]) -> float:
    """The share of the largest of `sizes` that `kept` is, out of 1 (all zero: all of it)."""
    largest = max(sizes)
    return float(kept / largest) if largest > 0 else 1.0


def kept_share(a: Updates, b: Updates) -> tuple[float, float]:
    """A round of two senders in the record: the share of the larger update (sizes summed over
    every coordinate) that their agreeing minimum keeps, out of 1 (both zero: all of it)."""
    kept = size({part: agreeing_minimum([a[part], b[part]]) for part in a})
    return share_kept(float(kept), [float(size(a)), float(size(b))]), 1.0
