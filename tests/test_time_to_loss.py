"""benchmarks/time_to_loss.py reads what it claims: a loss curve over wall time, the first time it
reaches a loss, the efficiency, the peers' own log lines, and every checkpoint a peer saved."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
from swarm_helpers import wait_for

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_time_to_loss() -> ModuleType:
    """The benchmark as a module, with its folder on the path while it imports (`from sync import`)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("time_to_loss")
    finally:
        sys.path.remove(str(BENCHMARKS))


ttl = load_time_to_loss()


def curve(*points: tuple[float, float]) -> list[dict]:
    return [{"seconds": s, "validation_loss": loss} for s, loss in points]


def test_the_time_to_a_loss_is_its_first_crossing_linear_between_saves():
    falling = curve((0, 5.0), (10, 3.0), (20, 2.0), (30, 2.5), (40, 1.5))
    assert ttl.time_to(falling, 2.5) == pytest.approx(15.0)  # halfway from 3.0 at 10 s to 2.0 at 20 s
    assert ttl.time_to(falling, 2.0) == pytest.approx(20.0)  # reached exactly at a save
    assert ttl.time_to(falling, 1.5) == pytest.approx(40.0)  # not at 30 s, where the loss rose again
    assert ttl.time_to(falling, 1.0) is None  # never reached: no number


def test_efficiency_is_the_target_runs_seconds_over_regions_seconds_to_the_target_runs_final_loss():
    no_delay = curve((0, 5.0), (50, 3.0), (100, 2.0))
    regions = curve((0, 5.0), (60, 3.0), (120, 2.2), (140, 1.8))
    found = ttl.efficiency(no_delay, regions)
    assert found["target_loss"] == 2.0 and found["no_delay_seconds"] == pytest.approx(100.0, rel=1e-3)
    assert found["regions_seconds"] == pytest.approx(130.0, rel=1e-3)  # halfway from 2.2 at 120 s to 1.8 at 140 s
    assert found["efficiency"] == pytest.approx(100 / 130, rel=1e-3) and found["reached"]
    slower = ttl.efficiency(no_delay, curve((0, 5.0), (150, 2.5)))
    assert slower["reached"] is False and slower["efficiency"] is None
    assert slower["final_loss"] == 2.5 and slower["final_loss_over_target"] == pytest.approx(1.25)


def test_a_regions_run_past_the_target_runs_steps_is_timed_on_and_reports_its_loss_at_those_steps():
    """A mode just behind dense at the target run's last step reaches the target later, on its
    extra steps: it gets an efficiency, and its loss at equal steps stands beside it."""
    no_delay = [{"step": s, "seconds": t, "validation_loss": loss} for s, t, loss in ((0, 0, 5.0), (600, 100, 2.0))]
    regions = [{"step": s, "seconds": t, "validation_loss": loss}
               for s, t, loss in ((0, 0, 5.0), (600, 80, 2.1), (900, 120, 1.9))]  # fmt: skip
    found = ttl.efficiency(no_delay, regions)
    assert found["reached"] and found["regions_seconds"] == pytest.approx(100.0, rel=1e-3)  # 2.0 crossed at 100 s
    assert found["loss_at_target_steps"] == 2.1 and found["final_loss"] == 1.9


def test_a_loss_a_rounding_error_above_the_target_reaches_it_and_a_real_gap_does_not():
    """Dense computes the same weights in both runs: they differ by float rounding only."""
    no_delay = curve((0, 5.0), (50, 3.0), (100, 2.0))
    rounding = ttl.efficiency(no_delay, curve((0, 5.0), (100, 3.0), (200, 2.0 * (1 + 5e-6))))
    assert rounding["reached"] and rounding["efficiency"] == pytest.approx(0.5, rel=1e-3)
    assert not ttl.efficiency(no_delay, curve((0, 5.0), (100, 3.0), (200, 2.0 * 1.001)))["reached"]


def test_the_summary_names_the_best_mode_and_judges_it_against_the_target():
    modes = {"a": {"efficiency": 0.9, "reached": True}, "b": {"efficiency": 0.97, "reached": True},
             "c": {"efficiency": None, "reached": False}, "d": {"error": "r1 exited early"}}  # fmt: skip
    found = ttl.summary(modes)
    assert (found["best_mode"], found["best_efficiency"], found["met"]) == ("b", 0.97, True)
    assert found["not_reached"] == ["c"] and found["failed"] == ["d"]
    assert ttl.summary({"a": {"efficiency": 0.8, "reached": True}})["met"] is False


def test_the_best_mode_is_a_compressed_one_never_the_target_mode_itself():
    """Dense in the regions is a mode to report, not the best compressed one: the headline asks
    how close compression and the internet come to the datacenter."""
    modes = {ttl.TARGET_MODE: {"efficiency": 0.99, "reached": True}, "demo": {"efficiency": 0.7, "reached": True}}
    found = ttl.summary(modes)
    assert found["best_mode"] == "demo" and found["efficiency"][ttl.TARGET_MODE] == 0.99


def test_a_point_is_the_replicas_mean_loss_when_the_last_of_them_saved_it():
    starts = {"r0": 100.0, "r1": 101.0}
    saves = {"r0": {10: 110.0, 20: 121.0}, "r1": {10: 112.0, 20: 120.0, 30: 131.0}}
    losses = {"r0": {10: 3.0, 20: 2.0}, "r1": {10: 3.2, 20: 2.4, 30: 2.1}}
    points = ttl.loss_curve(starts, saves, losses, start_loss=5.5)
    assert [p["step"] for p in points] == [0, 10, 20]  # step 30: r0 has none, so no mean
    assert [p["seconds"] for p in points] == [0.0, 12.0, 21.0]  # from r0's first step, to the later save
    assert [p["validation_loss"] for p in points] == pytest.approx([5.5, 3.1, 2.2])


def test_outer_modes_save_only_at_the_end_of_a_round():
    rounds = ttl.OuterConfig().steps
    assert ttl.save_every("outer-overlap-spare", 20) == rounds
    assert ttl.save_every("outer-overlap", rounds + 1) == 2 * rounds
    assert ttl.save_every("demo-overlap-spare", 20) == 20 and ttl.save_every("dense", 7) == 7


def test_every_checkpoint_saved_is_kept_also_once_the_peer_deleted_it(tmp_path):
    peer, kept = tmp_path / "r0", tmp_path / "kept"
    peer.mkdir()
    with ttl.kept_checkpoints(tmp_path, ["r0"], kept):
        (peer / "block_1_step_10.safetensors").write_bytes(b"ten")
        wait_for(lambda: (kept / "r0" / "block_1_step_10.safetensors").exists(), 10, "the first checkpoint kept")
        (peer / "block_1_step_10.safetensors").unlink()  # as the peer's store prunes an old one
        (peer / "block_1_step_20.safetensors").write_bytes(b"twenty")  # saved after the last poll, perhaps
    assert sorted(p.name for p in (kept / "r0").iterdir()) == [
        "block_1_step_10.safetensors",
        "block_1_step_20.safetensors",
    ]
    assert (kept / "r0" / "block_1_step_10.safetensors").read_bytes() == b"ten"


def test_a_peer_logs_when_its_first_step_starts_and_when_each_checkpoint_is_written(lent_swarm):
    """The log lines the benchmark times a run by, from a real peer."""
    local, client = lent_swarm
    extra = [
        "--sync",
        "none",
        "--max-steps",
        "4",
        "--save-every",
        "2",
        "--announce-period",
        "1",
        "--average-every",
        "0",
    ]
    peer = local.start_peer("r0", "0", extra)
    wait_for(lambda: any(h.announcement.state == "serving" for h in client.directory.hosts(0)), 120, "r0 to finish")
    started, saved = ttl.log_times(peer.log())
    assert started is not None and sorted(saved) == [2, 4], peer.log()[-2000:]
    assert started <= saved[2] <= saved[4]
