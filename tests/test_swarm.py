"""The swarm with real processes on 127.0.0.1: bootstrap, peers, fetch, join, crash, forged records."""

from __future__ import annotations

import json
import signal
import time

import pytest
import torch
from helpers import assert_one_line_error, run_command
from hivemind.utils import get_dht_time
from safetensors.torch import load_file
from swarm_helpers import FAST_PEER, tiny_swarm, wait_for, write_tiny_setup

from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_model_folder
from swarm.p2p.records import BlockAnnouncement, block_key

SWARM = "swarmtest"


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """A bootstrap node and one peer per block of a tiny model, each trained for 6 steps."""
    with tiny_swarm(tmp_path_factory.mktemp("swarm"), SWARM, {"a": "0", "b": "1"}) as (local, peers, client):
        directory = client.directory
        local.peers, local.directory = peers, directory
        wait_for(lambda: all(serving(directory, b, 6) for b in (0, 1)), 30, "both blocks served at step 6")
        yield local


def serving(directory, block: int, step: int) -> list:
    return [h for h in directory.hosts(block) if h.announcement.state == "serving" and h.announcement.step == step]


def peer_file(local: LocalSwarm, name: str, block: int, step: int):
    return local.workdir / name / f"block_{block}_step_{step}.safetensors"


def test_fetch_assembles_the_peers_latest_checkpoints_and_generates(swarm):
    result = swarm.run("swarm-fetch", "--out", "fetched")
    assert result.returncode == 0, result.stderr
    model = load_model_folder(swarm.workdir / "fetched")
    for block, name in ((0, "a"), (1, "b")):
        expected = load_file(peer_file(swarm, name, block, 6))
        got = model.modules[block].state_dict()
        assert expected.keys() == got.keys()
        assert all(torch.equal(expected[k], got[k]) for k in expected)
        assert model.manifest["blocks"][str(block)]["step"] == 6
    generated = run_command("swarm-generate", "--model", "fetched", "--max-bytes", "12", "hello", cwd=swarm.workdir)
    assert generated.returncode == 0, generated.stderr


def test_status_lists_every_block_and_host(swarm):
    result = swarm.run("swarm-status", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["hosts"]
    assert {(r["block"], r["public_name"], r["step"]) for r in rows} == {(0, "a", 6), (1, "b", 6)}


def test_joining_replica_starts_from_host_checkpoint_then_survives_crashes(swarm):
    directory = swarm.directory
    joiner = swarm.start_peer("c", "0", FAST_PEER)
    def c_announcements():  # "joining" entries carry no progress yet; the first one after is checked
        return [h for h in directory.hosts(0)
                if h.announcement.public_name == "c" and h.announcement.state != "joining"]

    c_hosts = wait_for(c_announcements, 60, "c announced after joining")
    assert c_hosts[0].announcement.step == 6  # it starts from the host's step 6, not from 0
    wait_for(lambda: peer_file(swarm, "c", 0, 6).exists(), 30, "c's checkpoint")
    assert peer_file(swarm, "c", 0, 6).read_bytes() == peer_file(swarm, "a", 0, 6).read_bytes()

    # the original host of block 0 crashes: its record expires and fetch uses the joiner
    a_id = [h.peer_id for h in directory.hosts(0) if h.announcement.public_name == "a"][0]
    swarm.stop(swarm.peers["a"], signal.SIGKILL)
    wait_for(lambda: a_id not in {h.peer_id for h in directory.hosts(0)}, 30, "a's record to expire")
    result = swarm.run("swarm-fetch", "--out", "after-crash")
    assert result.returncode == 0, result.stderr
    assert load_model_folder(swarm.workdir / "after-crash").manifest["blocks"]["0"]["public_name"] == "c"

    # the last host of block 0 crashes: fetch names the block and leaves no folder behind
    swarm.stop(joiner, signal.SIGKILL)
    wait_for(lambda: not directory.hosts(0), 30, "block 0 to have no host")
    result = swarm.run("swarm-fetch", "--out", "missing")
    assert_one_line_error(result, "block(s) 0")
    assert not (swarm.workdir / "missing").exists()
    assert not [p for p in swarm.workdir.iterdir() if p.name.startswith(".missing")]


def test_records_under_another_peers_subkey_or_off_schema_are_rejected(swarm):
    directory = swarm.directory
    victim = wait_for(lambda: [h for h in directory.hosts(1) if h.announcement.public_name == "b"], 30, "b")[0]
    found = directory.dht.get(block_key(SWARM, 1), latest=True)
    victim_subkey = next(k for k, v in found.value.items() if v.value["peer_id"] == victim.peer_id)
    forged = BlockAnnouncement(peer_id=victim.peer_id, state="leaving", step=999).model_dump()
    stored = directory.dht.store(block_key(SWARM, 1), forged, get_dht_time() + 60, subkey=victim_subkey)
    assert not stored
    unowned = BlockAnnouncement(peer_id="y", state="training", step=1).model_dump()
    assert not directory.dht.store(block_key(SWARM, 1), unowned, get_dht_time() + 60, subkey=b"no key in this subkey")
    off_schema = {"peer_id": "x", "state": "hacking", "step": -1}
    assert not directory.dht.store(block_key(SWARM, 1), off_schema, get_dht_time() + 60, subkey=directory.owner_subkey)
    hosts = directory.hosts(1)
    assert [h.announcement.step for h in hosts if h.peer_id == victim.peer_id] == [6]
    assert all(h.announcement.peer_id not in ("x", "y") for h in hosts)


def test_peer_refuses_bad_options_with_one_line(swarm, tmp_path):
    peer_args = swarm.peer_args("bad", "0")[1:]  # without the program itself
    cases = [
        (["--swarm", "has.dot", "--initial-peers", *swarm.initial_peers], "no dots"),
        (["--swarm", SWARM, "--initial-peers", "not-a-multiaddr"], "not a multiaddr"),
        (["--swarm", SWARM, "--initial-peers",
          "/ip4/127.0.0.1/tcp/1/p2p/QmSoLnSGccFuZQJzRadHn95W2CrSFmZuTdDWP8HXaHca9z"], "could not join"),
        ([*peer_args[: peer_args.index("--block")], "--block", "7", *peer_args[peer_args.index("--block") + 2 :]],
         "out of range"),
    ]
    for args, fragment in cases:
        assert_one_line_error(run_command("swarm-peer", *args, cwd=tmp_path), fragment)


def test_sigterm_saves_announces_leaving_and_exits_cleanly(swarm):
    directory = swarm.directory
    b_id = wait_for(lambda: [h for h in directory.hosts(1) if h.announcement.public_name == "b"], 30, "b")[0].peer_id
    code = swarm.stop(swarm.peers["b"], signal.SIGTERM, timeout=10)  # killed (and the test fails) past 10 s
    assert code == 0, swarm.peers["b"].log()[-2000:]
    assert b_id not in {h.peer_id for h in directory.hosts(1)}  # gone at once: it said it was leaving
    assert "peer stopped" in swarm.peers["b"].log()


def test_restarted_peer_resumes_from_its_own_checkpoint_dir(swarm):
    """b left (previous test); block 1 has no host now. Restarted on the same folder, b resumes."""
    directory = swarm.directory
    wait_for(lambda: not directory.hosts(1), 30, "block 1 to have no host")
    again = swarm.start_peer("b", "1", FAST_PEER)
    resumed = wait_for(lambda: [h for h in directory.hosts(1) if h.announcement.state != "joining"], 60, "b back")
    assert resumed[0].announcement.step == 6
    assert "from own checkpoint" in again.log()


def test_a_peer_stays_listed_for_as_long_as_its_join_takes(swarm):
    """Block 0 has no host since the crash test. A peer that waits there for a second replica
    (or loads, or fetches a checkpoint) for longer than its record lives (three announce
    periods) is listed all along: one missing from the others' lists would have them train on
    without its payloads."""
    directory = swarm.directory
    lonely = swarm.start_peer("lonely", "0", [*FAST_PEER, "--wait-for-replicas", "2"])
    listed = lambda: [h for h in directory.hosts(0) if h.announcement.public_name == "lonely"]  # noqa: E731
    wait_for(lambda: [h for h in listed() if h.announcement.state == "training"], 60, "lonely waiting for a replica")
    seen = []
    for _ in range(8):  # four record lifetimes
        time.sleep(1.5)
        seen.append(bool(listed()))
    assert all(seen), seen
    assert lonely.process.poll() is None and "saved step" not in lonely.log()  # still waiting, not training
    assert swarm.stop(lonely, signal.SIGTERM, timeout=20) == 0


def test_bootstrap_identity_is_created_once_and_kept(tmp_path):
    config_path, _ = write_tiny_setup(tmp_path)
    peer_ids = []
    for _ in range(2):
        with LocalSwarm(tmp_path, swarm="identity", config_path=config_path) as local:
            peer_ids.append(local.start_bootstrap()[0].rsplit("/p2p/", 1)[1])
    assert (tmp_path / "bootstrap.id").exists()
    assert peer_ids[0] == peer_ids[1]
