"""The robust aggregate that brings drifted replicas back together (swarm/sync/reconcile.py)."""

from __future__ import annotations

import torch

from swarm.sync.reconcile import Voice, median_of, weighted_median


def voice(name: str, keys: int, *values: float) -> Voice:
    return Voice(name, {"w": torch.tensor(values)}, keys)


def test_a_weighted_median_picks_the_value_where_half_the_weight_is_reached():
    stacked = torch.tensor([[1.0, 5.0], [3.0, 2.0], [2.0, 9.0]])
    assert torch.equal(weighted_median(stacked, torch.tensor([1.0, 1.0, 1.0])), torch.tensor([2.0, 5.0]))
    assert torch.equal(weighted_median(stacked, torch.tensor([1.0, 3.0, 1.0])), torch.tensor([3.0, 2.0]))


def test_a_checkpoint_vouched_for_by_a_majority_of_keys_is_taken_bit_for_bit():
    honest = voice("aa", 2, 0.1, -0.2, 0.3)
    merged = median_of([honest, voice("ff", 1, 1e30, 1e30, -1e30)])
    assert torch.equal(merged["w"], honest.tensors["w"])


def test_a_liar_among_three_drifted_replicas_cannot_move_a_weight_outside_the_honest_range():
    honest = [voice("a1", 1, 0.1, 0.2), voice("a2", 1, 0.3, -0.1)]
    for lie in (1e30, -1e30, float(2**20)):
        merged = median_of([*honest, voice("zz", 1, lie, lie)])["w"]
        low = torch.minimum(honest[0].tensors["w"], honest[1].tensors["w"])
        high = torch.maximum(honest[0].tensors["w"], honest[1].tensors["w"])
        assert bool(((low <= merged) & (merged <= high)).all()), (lie, merged)


def test_two_replicas_that_disagree_change_nothing():
    assert median_of([voice("aa", 1, 0.1), voice("bb", 1, 5.0)]) is None


def test_every_replica_that_reads_the_same_checkpoints_computes_the_same_median():
    voices = [voice("c", 1, 0.5, 0.1), voice("a", 1, 0.2, 0.4), voice("b", 1, 0.3, -0.3)]
    assert torch.equal(median_of(voices)["w"], median_of(voices[::-1])["w"])
