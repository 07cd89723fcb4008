"""Replica sync between real peer processes: identical replicas, and no hang on a dead one."""

from __future__ import annotations

import signal

from safetensors.torch import load_file

from swarm_helpers import tiny_swarm, wait_for

SYNC = ["--sync", "demo", "--wait-for-replicas", "2", "--save-every", "50", "--announce-period", "1"]


def final_checkpoint(local, name: str, step: int):
    return load_file(local.workdir / name / f"block_0_step_{step}.safetensors")


def test_two_replicas_that_get_every_payload_stay_identical(tmp_path):
    with tiny_swarm(tmp_path, "synctest", {"b": "1"}) as (local, _, directory):
        extra = [*SYNC, "--max-steps", "12", "--sync-deadline", "20"]
        local.start_peer("r1", "0", extra)
        local.start_peer("r2", "0", extra)
        def finished():
            found = [h.announcement for h in directory.hosts(0) if h.announcement.state == "serving"]
            return found if len(found) == 2 else []

        r1, r2 = sorted(wait_for(finished, 120, "r1 and r2 to finish"), key=lambda a: a.public_name)
        assert r1.sync_steps == r2.sync_steps == 12
        assert r1.sync_bytes_received == r2.sync_bytes_sent > 0  # counted on both ends of the wire
        assert r2.sync_bytes_received == r1.sync_bytes_sent > 0
        first, second = final_checkpoint(local, "r1", 12), final_checkpoint(local, "r2", 12)
        assert first.keys() == second.keys()
        differing = [k for k in first if not (first[k] == second[k]).all()]
        assert not differing, differing
        assert "refused" not in local.started[-1].log() + local.started[-2].log()


def test_a_killed_replica_does_not_stop_the_others(tmp_path):
    with tiny_swarm(tmp_path, "synckill", {"b": "1"}) as (local, _, directory):
        extra = [*SYNC, "--max-steps", "40", "--sync-deadline", "1"]
        survivor = local.start_peer("r1", "0", extra)
        victim = local.start_peer("r2", "0", extra)
        wait_for(lambda: any(h.announcement.step >= 5 for h in directory.hosts(0)), 120, "replicas stepping")
        local.stop(victim, signal.SIGKILL)
        # with a 1 s deadline, 40 steps take well under this bound even if every step waits in vain
        wait_for(lambda: any(h.announcement.state == "serving" and h.announcement.public_name == "r1"
                             for h in directory.hosts(0)), 90, "the survivor to finish its steps")
        assert survivor.process.poll() is None  # still up, serving
