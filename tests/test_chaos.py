"""Churn on a real local swarm, briefly: peers killed and replaced every few seconds lose nothing.
The long soak, with `swarm-fetch` run during the churn and beside the same swarm left calm, is
benchmarks/chaos.py (a fetch takes most of a minute on two busy cores)."""

from __future__ import annotations

from swarm_helpers import write_tiny_setup

from swarm.lab.chaos import ChaosConfig, ChaosMonkey
from swarm.lab.launch import LocalSwarm
from swarm.serving.remote import RemoteBlocks

CHAOS_PEER = ["--save-every", "5", "--announce-period", "1", "--sync", "demo", "--sync-deadline", "2"]


def test_churn_loses_no_block_tears_no_checkpoint_and_hangs_nothing(tmp_path):
    config_path, corpus_path = write_tiny_setup(tmp_path)
    with LocalSwarm(tmp_path, swarm="chaostest", config_path=config_path, data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2)
        with local.client() as client:
            config = client.directory.wait_for_model(30)
            runner = RemoteBlocks(client.directory, client.p2p, client.loop, config, ping_timeout=2)
            chaos = ChaosConfig(duration_s=25, kill_every_s=4, fetch_every_s=None, peer_extra=CHAOS_PEER, seed=1)
            monkey = ChaosMonkey(local, runner, chaos)
            monkey.start_peers()
            monkey.run()
            monkey.check_checkpoints()
            report = monkey.report()
    # a replacement takes 10-20 s to start on 2 busy cores, and only a block with two replicas up loses one
    assert report["killed_sigkill"] + report["killed_sigterm"] >= 2, report
    assert report["blocks_lost"] == [] and report["torn_checkpoints"] == 0 and report["hangs"] == 0, report
    assert report["checkpoints_checked"] > 0, report
    assert report["samples_with_a_block_down"] == 0, report
    assert all(last > first for first, last in zip(report["first_step_per_block"], report["last_step_per_block"])), (
        report
    )
