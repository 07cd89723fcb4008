"""Checking a replica's answers against other replicas': identical replicas give identical answers.

A peer serves the checkpoint it announces (see `swarm.serving.server`), and a request names the
checkpoint it wants, so replicas that announce the same checkpoint compute the same function:
their answers to one request differ only by floating-point noise (the masked family's byte ids
not at all). A generation client sends every request to a second replica of the same checkpoint
under another key, and on a disagreement asks more; a strict majority decides which answer is
used, and where none forms the client computes the answer itself (remote.py has the policy and
its cost). A majority of keys decides an answer but proves no one a liar (two Sybil keys outvote
an honest third): only the client's own computation bans a replica for good.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Answer = tuple[torch.Tensor, torch.Tensor | None]  # (the state after the block's steps, logits if asked)


@dataclass
class CrossCheckPolicy:
    tolerance: float = 1e-3  # relative difference two answers may have and still agree
    witnesses: int = 2  # other replicas asked at most on a disagreement, so that three answers can form a majority


@dataclass
class CrossCheckStats:
    """What the checks cost and found (reported by the serving benchmarks)."""

    requests_checked: int = 0  # answers a witness was asked to confirm
    extra_requests: int = 0  # requests to witnesses
    disagreements: int = 0
    undecided: int = 0  # disagreements nothing settled: no majority, and no file or no replica matching it
    computed_here: int = 0  # answers computed from the checkpoint's file: a disagreement, or no witness answering
    banned: int = 0  # replicas outvoted (banned a while) or contradicted by the answer computed here (for good)
    unconfirmed: int = 0  # answers dropped: no witness, no other key announcing, and a checkpoint not measured here
    seconds: float = 0.0  # spent on the checks beyond the answers' own round trips
    checkpoints_measured: int = 0  # downloaded and spot-checked: those with one key; in an open swarm, all
    measuring_seconds: float = 0.0


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
    (None, []) when no answer has a majority. The majority is of keys, which anyone can make: it
    says which answer to use, not who lied."""
    for peer_id, answer in answers.items():
        agreeing = [other for other, theirs in answers.items() if agree(answer, theirs, z_in, tolerance)]
        if 2 * len(agreeing) > len(answers):
            return peer_id, [other for other in answers if other not in agreeing]
    return None, []
