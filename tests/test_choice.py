"""Which checkpoint to believe, against hosts that lie about what their checkpoint is worth.

Each scenario has one honest host, so that agreement among honest hosts cannot save the
result: only the rule under test can.
"""

from __future__ import annotations

from swarm_helpers import HOSTS_SWARM, client_of

from swarm.checkpoints.choice import SpotCheck, choose_checkpoint
from swarm.lab.attacks import overflowing_block
from swarm.model.checkpoint import encode_block
from swarm.model.denoiser import build_block
from swarm.model.train import TrainConfig, block_trainer, train


def test_a_checkpoint_whose_loss_is_not_a_number_loses_to_a_lone_honest_host(start, tiny_config, tiny_windows):
    honest, liar = start("honest"), start("liar")
    good = honest.put(encode_block(build_block(tiny_config, 0), tiny_config, 0, 10, HOSTS_SWARM), 10)
    bad = liar.put(encode_block(overflowing_block(tiny_config, 0), tiny_config, 0, 11, HOSTS_SWARM), 11)  # one save ahead
    spot_check = SpotCheck(tiny_windows.fixed(8))
    with client_of(honest, liar) as client:
        choice = client.run(choose_checkpoint(client.p2p, [liar.host(bad), honest.host(good)], tiny_config, 0,
                                              spot_check, show_progress=False), 120)  # fmt: skip
    assert [m.candidate.checkpoint.step for m in choice.measured] == [11, 10]  # both measured, the liar first
    assert choice.checkpoint == good, choice


def test_a_candidate_whose_loss_is_not_a_number_does_not_switch_off_the_comparison_with_the_best(
    start, tiny_config, tiny_windows
):
    """A NaN beside a poor but finite candidate: the poor one must still lose to the honest
    host's better loss (were NaN the best loss, every comparison with it would pass)."""
    trained = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=60, warmup_steps=5))
    train(trained, 60)
    honest, poor, liar = start("honest"), start("poor"), start("liar")
    good = honest.put(encode_block(trained.module, tiny_config, 0, 10, HOSTS_SWARM), 10)
    fresh = poor.put(encode_block(build_block(tiny_config, 0), tiny_config, 0, 11, HOSTS_SWARM), 11)
    nan = liar.put(encode_block(overflowing_block(tiny_config, 0), tiny_config, 0, 12, HOSTS_SWARM), 12)
    spot_check = SpotCheck(tiny_windows.fixed(8))
    hosts = [liar.host(nan), poor.host(fresh), honest.host(good)]
    with client_of(honest, poor, liar) as client:
        choice = client.run(choose_checkpoint(client.p2p, hosts, tiny_config, 0, spot_check, show_progress=False), 120)
    losses = {m.candidate.checkpoint.step: m.loss for m in choice.measured}
    assert losses[11] > losses[10] + spot_check.tolerance, losses  # the poor one is measurably worse
    assert choice.checkpoint == good, losses
