"""Checking a replica's answers against other replicas': identical replicas give identical answers.

A peer serves the checkpoint it announces (see `swarm.serving.server`), and a request names the
checkpoint it wants, so replicas that announce the same checkpoint compute the same function:
their answers to one request differ only by floating-point noise. A generation client sends a
fraction of its requests (and the first one to every replica it starts using) to up to two
more replicas of the same checkpoint; when the answers disagree, the majority decides, and a
replica the majority contradicts is banned. Two replicas that disagree with no third to ask
decide nothing (counted as undecided).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Answer = tuple[torch.Tensor, torch.Tensor | None]  # (the state after the block's steps, logits if asked)


@dataclass
class CrossCheckPolicy:
    fraction: float = 0.1  # of the requests to a replica already checked once
    tolerance: float = 1e-3  # relative difference two answers may have and still agree
    witnesses: int = 2  # other replicas asked at most, so that three answers can form a majority


@dataclass
class CrossCheckStats:
    """What the checks cost and found (reported by the serving benchmarks)."""

    requests_checked: int = 0
    extra_requests: int = 0
    disagreements: int = 0
    undecided: int = 0
    banned: int = 0
    seconds: float = 0.0


def agree(a: Answer, b: Answer, z_in: torch.Tensor, tolerance: float) -> bool:
    """Whether two answers to one request match: byte ids (the masked family's state) exactly,
    embeddings z within `tolerance` of the step the block took, logits within `tolerance` of
    their own size."""
    (z_a, logits_a), (z_b, logits_b) = a, b
    if not z_a.is_floating_point() or not z_b.is_floating_point():
        if not torch.equal(z_a, z_b):
            return False
    elif (z_a - z_b).norm() > tolerance * ((z_a - z_in).norm() + 1e-6):
        return False
    if (logits_a is None) != (logits_b is None):
        return False
    return logits_a is None or (logits_a - logits_b).norm() <= tolerance * (logits_a.norm() + 1e-6)


def majority(answers: dict[str, Answer], z_in: torch.Tensor, tolerance: float) -> tuple[str | None, list[str]]:
    """(a replica whose answer a strict majority shares, the replicas that answered otherwise);
    (None, []) when no answer has a majority."""
    for peer_id, answer in answers.items():
        agreeing = [other for other, theirs in answers.items() if agree(answer, theirs, z_in, tolerance)]
        if 2 * len(agreeing) > len(answers):
            return peer_id, [other for other in answers if other not in agreeing]
    return None, []
