"""The confirmation rule: which answer of a block's replicas a generation client uses, whom it bans, whom it credits.

A peer serves the checkpoint it announces (see `swarm.serving.server`), and a request names the
checkpoint it wants, so replicas that announce the same checkpoint compute the same function:
their answers to one request differ only by floating-point noise (the masked family's byte ids
not at all). An honest pair always agrees (`agree`). What decides between answers that differ
depends on what a key costs (`SwarmDirectory.keys_count`).

**In an open swarm** (the default: a key costs nothing) nothing is decided by a count of keys,
and agreement among keys proves nothing: one stranger can run every key that agrees. The client
trusts its own computation of the block's steps, from the checkpoint's verified file (held while
the checkpoint is in use: vetting.py). Issue 57 showed why: two free keys announcing a lone host's
checkpoint and giving one wrong answer were "a strict majority", so the honest host was banned,
their answers were used and credited, and the lone-key audit never ran. Now (`one_voice`):
- the keys that serve the chosen checkpoint are one voice, and each request goes at the same moment
  to one replica under *each* of them (up to `CrossCheckPolicy.voice`; replicas.py): an honest host
  among them contradicts any lie, whoever answers fastest;
- where their answers differ, the client computes the answer itself and uses its own; those it
  contradicts are banned for good (unless it contradicts every one: its own arithmetic may differ,
  so none is banned, `against_own`; keys that contradict each other and it cost the client that
  block's steps for each answer, never a lie);
- where they agree, the answer is used as it is, but a share of such answers, drawn in private
  after they arrive (audit.py), is computed here all the same, whatever the number of keys that
  agree, as a lone key's are: each key contradicted then is banned for good (`checked`). Keys that
  always agree with each other and lie together are thus one liar to the audit: because every key
  is asked each time, the first checked lie bans all of them at once, so together they get on
  average (1 - p) / p lies used (3 at p = 0.25), and only where no honest host serves the checkpoint;
- where a key that announced the checkpoint (not banned for good) was not heard this time (busy,
  failed, banned for a while, or past the `voice` bound), the answer is computed here: liars must
  not gain from an honest fellow replica being made to fail. A record whose peer does not answer
  this client's pings (a peer that left: its record outlives it) is no voice (replicas.py).
Credit (swarm/p2p/ledger.py) goes only to answers that matched the answer computed here: an answer
used unchecked earns nothing, so a hostile key is credited only for work shown right here, and a
key shown wrong loses what this client credited it (`Witness.caught`).

**Where keys count** (a members-only swarm, whose keys carry the creator's certificate, or one
that prices an identity with work) the rule of issue 26 stays: a request to a checkpoint that another
key also serves goes at the same moment to one replica of it under another key, a *witness*, and the
answer is used only if the two are identical. On a disagreement more witnesses are asked (up to
`CrossCheckPolicy.witnesses`) and a strict majority decides (`witnessed`); where none can (two
keys), the client computes the answer itself. A replica that the client's own computation
contradicts is banned for the runner's life; one merely outvoted is banned for a while, as a
failing one is. Answers confirmed by another key are credited. An answer with no witness is used
as it is only if no other key announced the checkpoint and this client has measured it
(`unwitnessed`), checked at the audit's rate; where another key announced it but none answers now,
the client computes it; where the checkpoint is not measured, the answer is dropped and the block
asked again (`AskAgain`).

The rule only decides: it returns a `Verdict` (`Use` an answer, crediting some replicas and
perhaps banning others, or `AskAgain`), and the runner (remote.py) asks, bans and counts.

Why every answer and not a fraction of the requests: a liar that knows the policy lies only where
it is not checked. Checking the first request to a replica and then a fraction p lets one that
answers honestly until it has been checked corrupt (1 - p) / p answers on average before it is
caught. Asking every key leaves a liar beside an honest host nothing: its first lie is contradicted
before it is used, and gets it banned. What a liar still gets is cost: each key it burns makes a
client send one more request per span and compute one block's steps here once.
What it costs (counted by `tests/test_serving.py::test_what_confirming_every_answer_costs` and
`::test_what_running_a_block_here_costs`):
in an open swarm, one extra request per span for each other key serving a block's checkpoint (one
where every block has two replicas, as where keys count), at most `voice` - 1, sent at the same
moment (the slowest round trip of them, not their sum); and p of the answers used computed here
(`CrossCheckStats.lone_checked`), on the file already held. A checkpoint is measured once (one
download and spot check) before it is used. A stranger with many keys can make a client send up
to `voice` requests per span (then every answer is computed here) and download as many checkpoints,
once each. A disagreement costs the block's steps computed here (and one download where the file
is not held).
A client that must be sure runs a block itself (`RemoteBlocks.run_here`, `swarm-generate
--run-block`): every answer of that block computed here from the verified file, no request to any
host of it: one download and spot check, then the block's steps for every span.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Answer = tuple[torch.Tensor, torch.Tensor | None]  # (the state after the block's steps, logits if asked)


@dataclass
class CrossCheckPolicy:
    tolerance: float = 1e-3  # relative difference two answers may have and still agree
    witnesses: int = 2  # where keys count: other replicas asked at most on a disagreement (three can form a majority)
    voice: int = 9  # in an open swarm: keys of the chosen checkpoint asked per request, the chosen host's included
    # (the threat model's 8 free keys beside one honest host); where more announce it, each answer is computed here


@dataclass
class CrossCheckStats:
    """What the checks cost and found (reported by the serving benchmarks)."""

    requests_checked: int = 0  # answers witnesses were asked to confirm (at the same moment)
    extra_requests: int = 0  # requests to witnesses
    disagreements: int = 0
    undecided: int = 0  # disagreements nothing settled: no majority, and no file or no replica matching it
    computed_here: int = 0  # block steps computed from the checkpoint's file: a disagreement, a key unheard, an
    # audit, or a block this client runs itself (`RemoteBlocks.run_here`)
    banned: int = 0  # replicas outvoted (banned a while) or contradicted by the answer computed here (for good)
    unconfirmed: int = 0  # answers dropped: no witness, no other key announcing, and a checkpoint not measured here
    lone_checked: int = 0  # answers of one voice checked here all the same (audit.py): a lone key's; in an open
    # swarm, those every key of the checkpoint agreed on (its keys are one voice)
    seconds: float = 0.0  # spent on the checks beyond the answers' own round trips
    checkpoints_measured: int = 0  # downloaded and spot-checked: those with one key; in an open swarm, all
    measuring_seconds: float = 0.0


@dataclass(frozen=True)
class Ban:
    """Replicas to ask nothing more: for good where the client's own computation contradicts them,
    for a while (the runner's `ban_seconds`) where they are only outvoted (where keys count)."""

    peer_ids: tuple[str, ...]
    why: str
    for_good: bool


@dataclass(frozen=True)
class Use:
    """Use `answer`; credit the replicas whose answers were confirmed, and apply `ban`."""

    answer: Answer
    credit: tuple[str, ...] = ()  # replicas whose answers matched the one computed here, or where keys count,
    # another key's (swarm/p2p/ledger.py)
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
CONTRADICTED = "contradicted by the answer computed here"


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
    (None, []) when no answer has a majority. The majority is of keys: only where keys count
    (`witnessed`), and even there it says which answer to use, not who lied."""
    for peer_id, answer in answers.items():
        agreeing = [other for other, theirs in answers.items() if agree(answer, theirs, z_in, tolerance)]
        if 2 * len(agreeing) > len(answers):
            return peer_id, [other for other in answers if other not in agreeing]
    return None, []


def disputed(answers: dict[str, Answer], z_in: torch.Tensor, tolerance: float) -> bool:
    """Whether a witness contradicts the chosen host's answer (the first of `answers`)."""
    first, *others = answers.values()
    return any(not agree(first, other, z_in, tolerance) for other in others)


def one_voice(answers: dict[str, Answer], complete: bool, audited: bool, z_in: torch.Tensor, tolerance: float,
              compute_here: ComputeHere) -> Verdict:  # fmt: skip
    """An open swarm's verdict on the answers of the chosen host (first) and of a replica under
    each other key of its checkpoint (the module docstring): where they differ, the answer computed
    here (`against_own`); where they agree, theirs, uncredited, unless a key was not heard
    (`complete` false) or the answer is `audited`: then checked against the answer computed here."""
    if disputed(answers, z_in, tolerance):
        return against_own(answers, compute_here(), z_in, tolerance)
    if complete and not audited:
        return Use(next(iter(answers.values())))
    return checked(answers, compute_here(), z_in, tolerance)


def witnessed(answers: dict[str, Answer], z_in: torch.Tensor, tolerance: float, compute_here: ComputeHere) -> Verdict:
    """Where keys count: the verdict on the answers of the chosen host (first) and its witnesses to
    one request: the host's answer where every witness confirms it; else a strict majority's, the
    others outvoted; else, where none forms, the one computed here (`against_own`)."""
    answer = next(iter(answers.values()))
    if not disputed(answers, z_in, tolerance):
        return Use(answer, credit=tuple(answers))
    winner, liars = majority(answers, z_in, tolerance) if len(answers) > 2 else (None, [])
    if winner is not None:  # even a majority of certified keys is no proof: a ban for a while
        credit = tuple(p for p in answers if p not in liars)
        return Use(answers[winner], credit, Ban(tuple(liars), "outvoted by replicas under other keys", for_good=False))
    return against_own(answers, compute_here(), z_in, tolerance)


def against_own(answers: dict[str, Answer], right: Answer | None, z_in: torch.Tensor, tolerance: float) -> Verdict:
    """Where answers disagree and nothing else decides: the answer computed here (`right`), those
    it contradicts banned for good, unless it contradicts every replica (the client's own
    arithmetic may differ: none is banned). AskAgain where it could not be computed."""
    if right is None:
        return NOT_COMPUTED
    if not any(agree(a, right, z_in, tolerance) for a in answers.values()):
        return Use(right, undecided=True)
    return checked(answers, right, z_in, tolerance)


def checked(answers: dict[str, Answer], right: Answer | None, z_in: torch.Tensor, tolerance: float) -> Verdict:
    """The answer computed here (`right`), those of `answers` that match it credited and the others
    banned for good, all of them if none matches (answers no witness disputed, checked as a lone
    voice's are); AskAgain where it could not be computed."""
    if right is None:
        return NOT_COMPUTED
    liars = tuple(p for p, a in answers.items() if not agree(a, right, z_in, tolerance))
    credit = tuple(p for p in answers if p not in liars)
    return Use(right, credit, Ban(liars, CONTRADICTED, for_good=True) if liars else None)


def unwitnessed(host: str, answer: Answer, others_announce: bool, measured: bool, audited: bool,
                z_in: torch.Tensor, tolerance: float, compute_here: ComputeHere) -> Verdict:  # fmt: skip
    """Where keys count: the verdict on an answer no witness confirms: used as it is only from the
    lone key of a checkpoint `measured` here, unless this answer is `audited` (the share of a lone
    key's answers checked, drawn in private: audit.py); where `others_announce` (another key
    announced the checkpoint but none answers now), always checked, since a liar beside it could
    otherwise wait for its fellow replicas to be busy or banned. Checked: against the answer
    computed here, the host credited where they match and banned for good where they differ."""
    if not others_announce:
        if not measured:
            why = f"no other key confirms the answer of {host}, whose checkpoint is not measured"
            return AskAgain(why, unconfirmed=True)
        if not audited:
            return Use(answer)
    return checked({host: answer}, compute_here(), z_in, tolerance)
