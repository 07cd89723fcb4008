"""The lone-key audit's draw (swarm/serving/audit.py): its rate, its privacy, its expected harm."""

from __future__ import annotations

import random

import pytest

from swarm.serving.audit import AUDIT_RATE, LoneKeyAudit


def test_a_seeded_audit_checks_about_its_rate_of_answers():
    audit = LoneKeyAudit(draws=random.Random(5))
    checked = sum(audit.check_this_one() for _ in range(4000))
    assert abs(checked / 4000 - AUDIT_RATE) < 0.03


def test_the_default_audit_draws_from_the_operating_system_not_a_seed_a_host_could_know():
    assert isinstance(LoneKeyAudit().draws, random.SystemRandom)


def test_a_liar_gets_three_answers_used_on_average_before_its_first_checked_lie_at_the_default_rate():
    assert LoneKeyAudit().expected_lies_before_ban == pytest.approx(3.0)
    unchecked_runs = []
    draws = LoneKeyAudit(draws=random.Random(11))
    for _ in range(2000):  # a liar that lies every time: the answers used before the first check
        used = 0
        while not draws.check_this_one():
            used += 1
        unchecked_runs.append(used)
    assert sum(unchecked_runs) / len(unchecked_runs) == pytest.approx(3.0, abs=0.3)


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan")])
def test_an_audit_rate_outside_zero_to_one_is_refused(rate):
    with pytest.raises(ValueError):
        LoneKeyAudit(rate=rate)
