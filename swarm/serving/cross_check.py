"""The confirmation rule: which answer of a block's replicas a generation client uses, and whom it bans.

A peer serves the checkpoint it announces (see `swarm.serving.server`), and a request names the
checkpoint it wants, so replicas that announce the same checkpoint compute the same function:
their answers to one request differ only by floating-point noise (the masked family's byte ids
not at all). An honest pair always agrees (`agree`).

No answer is used on one key's word (issue 26, items 6 and 7):
- A request to a checkpoint that another key also serves goes at the same moment to a replica
  of it under another key, a *witness* (found anew for each request: replicas.py), and the
  answer is used only if the two are identical. On a disagreement more witnesses are asked (up
  to `CrossCheckPolicy.witnesses`) and a strict majority decides (`witnessed`); where none can
  (two keys), the client computes the answer itself from the checkpoint's verified file (held
  while the checkpoint is in use: vetting.py). The answer used is never a contradicted one. A
  replica that the client's own computation contradicts is banned for the runner's life; one
  merely outvoted is banned for a while, as a failing one is: a majority of keys is no proof
  (two Sybil keys outvote an honest third), and an outvoted liar that comes back is checked,
  and caught, again.
- An answer with no witness is used as it is only if no other key announced the checkpoint
  and this client has measured it (`unwitnessed`), and then not always: a share of such a lone
  key's answers, drawn in private after each answer arrives (audit.py), is checked against the
  answer computed here, and a host shown wrong is banned for good. Where another key announced it but none
  answers now, the client computes the answer itself and compares (a liar must not gain from
  its fellow replicas being busy or banned); where no other key announced it and it was not
  measured, the answer is dropped and the block is asked again of a checkpoint it may use,
  measuring lone ones first.
The rule only decides: it returns a `Verdict` (`Use` an answer, crediting some replicas and
perhaps banning others, or `AskAgain`), and the runner (remote.py) asks, bans and counts.

Why every answer and not a fraction: a liar that knows the policy lies only where it is not
checked. Checking the first request to a replica and then a fraction p lets one that answers
honestly until it has been checked corrupt (1 - p) / p answers on average before it is caught
(9 at p = 0.1); a random fraction from the first request does no better. Checking every answer
leaves it nothing: its first lie is caught before it is used, and gets it banned. What a liar
still gets is cost: each peer id it burns makes a client send a few more requests, or download
one checkpoint and compute one block's steps here (while no witness answers, the client
computes each answer of that block here).
What it costs (counted by `tests/test_serving.py::test_what_confirming_every_answer_costs`):
one extra request per span for each block whose checkpoint two keys or more serve (B extra
requests per span where every block has two replicas: twice an unchecked client's requests,
against about 0.1 per such block per span, after the first, under the old fraction, of which
benchmarks/serve.py measured 0.083 extra requests per request). Sent at
the same moment, the two requests cost the slower round trip of the two, not their sum. A block
whose checkpoint has one key costs no request: one download and spot check per client, as
swarm-fetch makes, then nothing; in an open swarm so does every checkpoint a block's answering
hosts announce (`SwarmDirectory.keys_count`), Sybils' included: a stranger with many keys can
make a client download as many checkpoints, once each. A disagreement costs up to `witnesses` more requests,
or the block's steps computed here (and one download where the file is not held).
A lone key's answers are the exception to "every answer": nobody can witness them, and checking
each would mean computing each here. They are checked at `audit.AUDIT_RATE`, so a liar gets on
average (1 - p) / p of its lies used (3 at p = 0.25) before its first checked one bans it for good;
that costs the client p of that block's steps computed here (`CrossCheckStats.lone_checked`).
A client that must be sure can run such a block itself, as it holds its weights.
"""

from __future__ import annotations

from collections.abc import Callable
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
    lone_checked: int = 0  # answers of a checkpoint's lone key checked here all the same (audit.py)
    seconds: float = 0.0  # spent on the checks beyond the answers' own round trips
    checkpoints_measured: int = 0  # downloaded and spot-checked: those with one key; in an open swarm, all
    measuring_seconds: float = 0.0


@dataclass(frozen=True)
class Ban:
    """Replicas to ask nothing more: for good where the client's own computation contradicts them,
    for a while (the runner's `ban_seconds`) where they are only outvoted."""

    peer_ids: tuple[str, ...]
    why: str
    for_good: bool


@dataclass(frozen=True)
class Use:
    """Use `answer`; credit the replicas whose answers another key's confirmed, and apply `ban`."""

    answer: Answer
    credit: tuple[str, ...] = ()  # replicas whose answers agreed with another key's (swarm/p2p/ledger.py)
    ban: Ban | None = None
    undecided: bool = False  # no replica matched the answer computed here: that one is used and none is banned


@dataclass(frozen=True)
class AskAgain:
    """Use no answer: the runner chooses the block's replica anew and asks again."""

    why: str
    unconfirmed: bool = False  # no witness, no other key announcing, its checkpoint not measured (counted)


Verdict = Use | AskAgain
ComputeHere = Callable[[], Answer | None]  # the answer computed from the checkpoint's file; None: no host serves it
NOT_COMPUTED = AskAgain("the answer must be computed here and no host serves the checkpoint's file")


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


def disputed(answers: dict[str, Answer], z_in: torch.Tensor, tolerance: float) -> bool:
    """Whether a witness contradicts the chosen host's answer (the first of `answers`): then more
    witnesses are asked before `witnessed` decides."""
    first, *others = answers.values()
    return any(not agree(first, other, z_in, tolerance) for other in others)


def witnessed(answers: dict[str, Answer], z_in: torch.Tensor, tolerance: float, compute_here: ComputeHere) -> Verdict:
    """The verdict on the answers of the chosen host (first) and its witnesses to one request:
    the host's answer where every witness confirms it; else a strict majority's, the others
    outvoted; else, where none forms, the one computed here (`against_own`)."""
    answer = next(iter(answers.values()))
    if not disputed(answers, z_in, tolerance):
        return Use(answer, credit=tuple(answers))
    winner, liars = majority(answers, z_in, tolerance) if len(answers) > 2 else (None, [])
    if winner is not None:  # a majority of keys is no proof (Sybil keys outvote honest ones): a ban for a while
        credit = tuple(p for p in answers if p not in liars)
        return Use(answers[winner], credit, Ban(tuple(liars), "outvoted by replicas under other keys", for_good=False))
    return against_own(answers, compute_here(), z_in, tolerance)


def against_own(answers: dict[str, Answer], right: Answer | None, z_in: torch.Tensor, tolerance: float) -> Verdict:
    """Where witnesses disagree and no majority forms: the answer computed here (`right`), those
    it contradicts banned for good, unless it contradicts every replica (the client's own
    arithmetic may differ: none is banned). AskAgain where it could not be computed."""
    if right is None:
        return NOT_COMPUTED
    liars = [p for p, a in answers.items() if not agree(a, right, z_in, tolerance)]
    if len(liars) == len(answers):
        return Use(right, undecided=True)
    credit = tuple(p for p in answers if p not in liars)
    return Use(right, credit, Ban(tuple(liars), "contradicted by the answer computed here", for_good=True))


def unwitnessed(host: str, answer: Answer, others_announce: bool, measured: bool, audited: bool,
                z_in: torch.Tensor, tolerance: float, compute_here: ComputeHere) -> Verdict:  # fmt: skip
    """The verdict on an answer no witness confirms: used as it is only from the lone key of a
    checkpoint `measured` here, unless this answer is `audited` (the share of a lone key's answers
    checked, drawn in private: audit.py); where `others_announce` (another key announced the
    checkpoint but none answers now), always checked, since a liar beside it could otherwise wait
    for its fellow replicas to be busy or banned. Checked: against the answer computed here, the
    host banned for good where they differ."""
    if not others_announce:
        if not measured:
            why = f"no other key confirms the answer of {host}, whose checkpoint is not measured"
            return AskAgain(why, unconfirmed=True)
        if not audited:
            return Use(answer)
    if (right := compute_here()) is None:
        return NOT_COMPUTED
    if agree(answer, right, z_in, tolerance):
        return Use(right)
    return Use(right, ban=Ban((host,), "contradicted by the answer computed here", for_good=True))
