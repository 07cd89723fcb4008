"""Which checkpoint to believe, against hosts that lie about what their checkpoint is worth.

Each scenario has one honest host, so that agreement among honest hosts cannot save the
result: only the rule under test can.
"""

from __future__ import annotations

import math

import pytest
from swarm_helpers import HOSTS_SWARM, client_of

from swarm.checkpoints.choice import (
    MEASURED_WHERE_KEYS_COUNT,
    Candidate,
    Measured,
    SpotCheck,
    believable,
    choose_checkpoint,
    rank,
    uniform_ce,
)
from swarm.checkpoints.transfer import max_checkpoint_bytes
from swarm.lab.attacks import degraded_block, overflowing_block
from swarm.model.checkpoint import encode_block
from swarm.model.denoiser import build_block
from swarm.model.train import TrainConfig, block_trainer, train
from swarm.p2p.directory import Host
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo

TOLERANCE = SpotCheck.tolerance

BYTE_UNIFORM_CE = math.log(256)  # what knowing nothing scores over raw bytes, the tiny models' units


def host(name: str, step: int, size: int = 1000, loss: float | None = None) -> Host:
    """A serving host under its own key `name`, announcing a checkpoint of `step` (its sha256 named by the step)."""
    checkpoint = CheckpointInfo(step=step, sha256=f"{step:064x}", size=size, chunks=f"{step:064x}")
    announcement = BlockAnnouncement(peer_id=name, state="serving", step=step, checkpoint=checkpoint, loss=loss)
    return Host(0, announcement, math.inf, owner=name.encode())


def steps_in_rank_order(hosts: list[Host], config) -> list[int]:
    return [c.checkpoint.step for c in rank(hosts, config)]


def test_a_checkpoint_two_keys_vouch_for_ranks_before_one_keys_newer_claim(tiny_config):
    """Agreement alone: both steps are plausible, so only the count of keys puts 10 first."""
    assert steps_in_rank_order([host("a", 10), host("b", 10), host("liar", 11)], tiny_config) == [10, 11]


def test_a_step_far_beyond_every_other_hosts_ranks_last(tiny_config):
    """Plausibility alone: one key each, so agreement cannot put the honest step first."""
    assert steps_in_rank_order([host("honest", 10), host("liar", 999_999)], tiny_config) == [10, 999_999]


def test_an_announced_size_no_block_of_the_model_weighs_is_never_a_candidate(tiny_config):
    hosts = [host("honest", 10), host("liar", 11, size=max_checkpoint_bytes(tiny_config) + 1)]
    assert steps_in_rank_order(hosts, tiny_config) == [10]


def measured(name: str, step: int, loss: float, announced: float | None = None) -> Measured:
    """A candidate of one host that downloaded and measured `loss` on the spot check."""
    one = host(name, step, loss=announced)
    return Measured(Candidate(one.announcement.checkpoint, (one,), plausible=True), b"", one, loss)


@pytest.mark.parametrize(
    "candidates, kept",
    [
        # each scenario has one rule that rejects the liar, and nothing else that could
        ([measured("liar", 11, 2.0 + 2 * TOLERANCE), measured("honest", 10, 2.0)], [10]),  # far worse than the best
        ([measured("liar", 11, BYTE_UNIFORM_CE + 1.0)], []),  # alone, and worse than knowing nothing
        ([measured("liar", 11, 4.0, announced=0.5)], []),  # alone, far worse than its host says
        ([measured("liar", 11, math.nan)], []),  # alone, and not a number
        # a NaN is not the best loss: were it, no comparison with it would reject the poor one
        ([measured("nan", 12, math.nan), measured("poor", 11, 2.0 + 2 * TOLERANCE), measured("honest", 10, 2.0)], [10]),
    ],
    ids=["worse than the best", "worse than uniform", "worse than announced", "not a number", "NaN is no best"],
)
def test_a_measured_candidate_is_believed_only_if_every_rule_passes(candidates, kept):
    assert [m.candidate.checkpoint.step for m in believable(candidates, TOLERANCE, BYTE_UNIFORM_CE)] == kept


@pytest.fixture
def trained_block(tiny_config, tiny_windows):
    """An honest host's block 0: trained a little, so that its loss is measurably better than a
    uniform guess (a freshly built block's may be worse, by the luck of its random start)."""
    trainer = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=60, warmup_steps=5))
    train(trainer, 60)
    return trainer.module


def test_a_checkpoint_whose_loss_is_not_a_number_loses_to_a_lone_honest_host(
    start, tiny_config, tiny_windows, trained_block
):
    honest, liar = start("honest"), start("liar")
    good = honest.put(encode_block(trained_block, tiny_config, 0, 10, HOSTS_SWARM), 10)
    bad = liar.put(encode_block(overflowing_block(tiny_config, 0), tiny_config, 0, 11, HOSTS_SWARM), 11)  # a save ahead
    spot_check = SpotCheck(tiny_windows.fixed(8))
    with client_of(honest, liar) as client:
        choice = client.run(choose_checkpoint(client.p2p, [liar.host(bad), honest.host(good)], tiny_config, 0,
                                              spot_check, show_progress=False), 120)  # fmt: skip
    assert [m.candidate.checkpoint.step for m in choice.measured] == [11, 10]  # both measured, the liar first
    assert choice.checkpoint == good, choice


def test_a_candidate_whose_loss_is_not_a_number_does_not_switch_off_the_comparison_with_the_best(
    start, tiny_config, tiny_windows, trained_block
):
    """A NaN beside a poor but finite candidate: the poor one must still lose to the honest
    host's better loss (were NaN the best loss, every comparison with it would pass)."""
    honest, poor, liar = start("honest"), start("poor"), start("liar")
    good = honest.put(encode_block(trained_block, tiny_config, 0, 10, HOSTS_SWARM), 10)
    fresh = poor.put(encode_block(build_block(tiny_config, 0), tiny_config, 0, 11, HOSTS_SWARM), 11)
    nan = liar.put(encode_block(overflowing_block(tiny_config, 0), tiny_config, 0, 12, HOSTS_SWARM), 12)
    spot_check = SpotCheck(tiny_windows.fixed(8))
    hosts = [liar.host(nan), poor.host(fresh), honest.host(good)]
    with client_of(honest, poor, liar) as client:
        choice = client.run(choose_checkpoint(client.p2p, hosts, tiny_config, 0, spot_check, show_progress=False), 120)
    losses = {m.candidate.checkpoint.step: m.loss for m in choice.measured}
    assert losses[11] > losses[10] + spot_check.tolerance, losses  # the poor one is measurably worse
    assert choice.checkpoint == good, losses


def test_a_degraded_checkpoint_many_keys_vouch_for_loses_to_a_lone_honest_host(start, tiny_config, tiny_windows):
    """The Sybil row of benchmarks/attacks.py in small: three keys serve one copy of the honest
    block made worse (`degraded_block`), a save ahead. It ranks first, and nothing about it alone
    gives it away (finite, better than a uniform guess): only the comparison with the honest
    candidate, measured beside it, refuses it."""
    trained = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=60, warmup_steps=5))
    train(trained, 60)
    spot_check = SpotCheck(tiny_windows.fixed(8))
    worse_by = 5 * spot_check.tolerance
    poison = degraded_block(trained.module, lambda denoiser: spot_check.measure(denoiser, tiny_config, 0), worse_by)
    honest, sybils = start("honest"), [start(f"sybil{i}") for i in range(3)]
    good = honest.put(encode_block(trained.module, tiny_config, 0, 10, HOSTS_SWARM), 10)
    data = encode_block(poison, tiny_config, 0, 11, HOSTS_SWARM)
    hosts = [sybil.host(sybil.put(data, 11)) for sybil in sybils] + [honest.host(good)]
    with client_of(honest, *sybils) as client:
        choice = client.run(choose_checkpoint(client.p2p, hosts, tiny_config, 0, spot_check, show_progress=False), 120)
    losses = {m.candidate.checkpoint.step: m.loss for m in choice.measured}
    assert list(losses) == [11, 10], losses  # the Sybils' checkpoint ranks first; both are measured
    assert losses[11] >= losses[10] + worse_by and losses[11] < uniform_ce(tiny_config), losses
    # alone, it would pass
    assert believable(choice.measured[:1], spot_check.tolerance, uniform_ce(tiny_config)), losses
    assert choice.checkpoint == good, losses


@pytest.mark.parametrize(
    "honest_step, sybil_steps",
    [(10, (11, 12, 13)), (200, (3, 2, 1))],
    ids=["a save or more ahead of it", "so far behind that its lead looks implausible"],
)
def test_free_keys_each_serving_another_degraded_checkpoint_cannot_keep_a_lone_honest_host_unmeasured(
    start, tiny_config, tiny_windows, honest_step, sybil_steps
):
    """Issue 27 with distinct checkpoints: three keys, free in this open swarm, each serve another
    copy of the honest block made worse (`degraded_block`, its own noise draw), ranked before the
    lone honest host's. They would fill the `MEASURED_WHERE_KEYS_COUNT` candidates, and measured
    only beside each other they pass. Chosen as swarm-fetch, a joiner and the chaos monkey choose
    (with the client's `SwarmDirectory.keys_count`), every candidate is measured and the honest one wins."""
    trained = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=60, warmup_steps=5))
    train(trained, 60)
    spot_check = SpotCheck(tiny_windows.fixed(8))
    loss = lambda denoiser: spot_check.measure(denoiser, tiny_config, 0)
    poisons = [degraded_block(trained.module, loss, 5 * spot_check.tolerance, seed=seed) for seed in range(3)]
    honest, sybils = start("honest"), [start(f"sybil{i}") for i in range(3)]
    good = honest.put(encode_block(trained.module, tiny_config, 0, honest_step, HOSTS_SWARM), honest_step)
    hosts = [sybil.host(sybil.put(encode_block(poison, tiny_config, 0, step, HOSTS_SWARM), step))
             for sybil, poison, step in zip(sybils, poisons, sybil_steps, strict=True)]
    hosts += [honest.host(good)]
    ranked = [c.checkpoint for c in rank(hosts, tiny_config)]
    assert len(set(ranked)) == 4 and ranked[-1] == good, ranked  # three distinct checkpoints rank before the honest one
    with client_of(honest, *sybils) as client:
        keys_count = client.directory.keys_count
        assert not keys_count  # an open swarm: no model record makes it members-only or prices a key
        choose = lambda counting: choose_checkpoint(client.p2p, hosts, tiny_config, 0, spot_check,
                                                    keys_count=counting, show_progress=False)  # fmt: skip
        choice = client.run(choose(keys_count), 120)
        where_keys_count = client.run(choose(True), 120)
    assert choice.checkpoint == good, choice.measured
    assert [m.candidate.checkpoint for m in choice.measured] == ranked, choice.measured  # every candidate measured
    sybils_measured = choice.measured[:3]
    # alone, each would pass
    assert believable(sybils_measured, spot_check.tolerance, uniform_ce(tiny_config)) == sybils_measured
    assert all(m.loss >= choice.loss + 5 * spot_check.tolerance for m in sybils_measured), choice.measured
    assert len(where_keys_count.measured) == MEASURED_WHERE_KEYS_COUNT  # where keys cost something: the top 3 only
