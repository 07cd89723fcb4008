"""Crashes and full disks: no torn checkpoint, the last good one kept, restarts resume from it."""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import conftest
import psutil
import pytest
from helpers import assert_one_line_error
from hivemind import DHT
from hivemind.p2p import P2P, PeerID
from swarm_helpers import FAST_PEER, wait_for, write_tiny_setup

from swarm.checkpoints.store import CheckpointStore
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import ModelConfig
from swarm.p2p.network import NetworkOptions, start_dht, stop_child

# a saver that resumes from its newest checkpoint and saves the next steps as fast as it can: one for
# each line read, forked from this process (which imports torch once, not once a restart, and runs
# no torch op itself: a forked saver starts clean); "ended" once the saver is dead and reaped
SAVER = """
import os
import sys
from swarm.model.denoiser import ModelConfig, build_block
from swarm.checkpoints.store import CheckpointStore
config = ModelConfig(d_model=256, n_heads=4, n_layers=8, n_blocks=4, prefix_len=64, gen_len=32)
while sys.stdin.readline():
    saver = os.fork()
    if saver == 0:
        store = CheckpointStore(sys.argv[1], config, block=0, swarm="crash")
        latest = store.latest()
        step = latest[1].step if latest else 0
        block = build_block(config, 0)
        print(os.getpid(), step, flush=True)
        while True:
            step += 1
            store.save(block, step)
    os.waitpid(saver, 0)
    print("ended", flush=True)
"""


def test_a_peer_killed_while_saving_leaves_a_whole_checkpoint_and_resumes_from_it(tmp_path):
    config = ModelConfig(d_model=256, n_heads=4, n_layers=8, n_blocks=4, prefix_len=64, gen_len=32)
    rng, resumed_at = random.Random(0), []
    savers = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for _ in range(12):
            savers.stdin.write("start\n")
            savers.stdin.flush()
            pid, step = map(int, savers.stdout.readline().split())
            resumed_at.append(step)
            time.sleep(rng.uniform(0.05, 0.6))  # a save takes ~30 ms: kills land mid-write as often as not
            os.kill(pid, signal.SIGKILL)
            assert savers.stdout.readline() == "ended\n"  # dead: nothing of it writes any more
            store = CheckpointStore(tmp_path, config, block=0, swarm="crash")  # also clears cut-short temp files
            files = sorted(p.name for p in tmp_path.iterdir())
            assert not [f for f in files if f.endswith(".tmp")], files
            path, info = store.latest()
            _, step = decode_block(path.read_bytes(), config, 0)  # whole: loads, right block, right step
            assert step == info.step
    finally:
        savers.kill()
        savers.wait()
    assert resumed_at == sorted(resumed_at) and resumed_at[-1] > resumed_at[1]  # every restart went on from the last


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_keeps_the_last_good_checkpoint_and_the_peer_running(lent_swarm, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    # room for two tiny-model checkpoints and a little: the third save (step 9) runs out of space
    size = int(2.6 * _tiny_checkpoint_bytes(tmp_path))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
    try:
        local, client = lent_swarm
        local.start_peer("b", "1", FAST_PEER)  # the other block, for the fetch
        wait_for(lambda: [h for h in client.directory.hosts(1) if h.announcement.state == "serving"], 90, "b serving")
        directory = client.directory
        extra = ["--max-steps", "9", "--save-every", "3", "--announce-period", "1", "--sync", "none",
                 "--checkpoint-dir", str(disk / "peer")]  # fmt: skip
        peer = local.start_peer("full", "0", extra)
        wait_for(lambda: "could not save" in peer.log(), 120, "the failed save's log line")
        record = wait_for(lambda: [h.announcement for h in directory.hosts(0)
                                   if h.announcement.public_name == "full" and h.announcement.state == "serving"],
                          120, "the peer to finish its steps")[0]  # fmt: skip
        fetched = local.run("swarm-fetch", "--out", "model")  # others can still fetch what it kept
        assert fetched.returncode == 0, fetched.stderr
        assert local.stop(peer) == 0
        kept = [p.name for p in (disk / "peer").iterdir()]
        assert all(name.startswith("block_0_step_") and name.endswith(".safetensors") for name in kept), kept
        newest = max(kept, key=lambda name: int(name.split("_")[3].split(".")[0]))  # no temp file left, and
        assert newest == f"block_0_step_{record.checkpoint.step}.safetensors", kept  # the newest is announced
        assert record.checkpoint.step < 9  # it announces the last checkpoint it could write
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _tiny_checkpoint_bytes(folder) -> int:
    from swarm.model.denoiser import build_block

    config = ModelConfig(**conftest.TINY)
    store = CheckpointStore(folder / "measure", config, block=0, swarm="fulldisk")
    return store.save(build_block(config, 0), 1).size


def test_a_peer_refuses_a_swarm_that_trains_another_config(lent_swarm):
    local, client = lent_swarm
    directory = client.directory
    real = directory.wait_for_model(10).hash()
    wrong = ("0" if real[0] != "0" else "1") + real[1:16]
    refused = subprocess.run(local.peer_args("picky", "0", ["--expect-config-hash", wrong]), check=False,
                             capture_output=True, text=True, timeout=120, cwd=local.workdir)  # fmt: skip
    assert_one_line_error(refused, "not the expected")
    accepted = local.start_peer("agreeing", "0", ["--expect-config-hash", real[:16], "--max-steps", "2",
                                                  "--announce-period", "1"])  # fmt: skip
    wait_for(lambda: any(h.announcement.public_name == "agreeing" for h in directory.hosts(0)), 90, "the peer to join")
    assert accepted.process.poll() is None


def dht_child(pid: int) -> psutil.Process:
    """The DHT process of a peer or bootstrap: its child that runs the libp2p daemon."""

    def found():
        return [c for c in psutil.Process(pid).children() if any("p2pd" in g.name() for g in c.children())]

    return wait_for(found, 30, "the DHT child process")[0]


def running(process: psutil.Process) -> bool:
    """Alive, and not a zombie waiting for its parent to read its exit status."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


LONE = ["--sync", "none", "--average-every", "0", "--announce-period", "1", "--save-every", "20", "--dht-timeout", "2"]


def test_a_dht_that_stops_answering_kills_neither_a_peer_nor_the_bootstrap(tmp_path):
    config_path, corpus_path = write_tiny_setup(tmp_path)
    with LocalSwarm(tmp_path, swarm="slowdht", config_path=config_path, data=corpus_path) as local:
        # its DHT calls time out after 2 s, not 20 s: it meets its first timeout within seconds
        local.start_bootstrap(refresh_period=2, extra=["--dht-timeout", "2"])
        with local.client() as client:
            # --sync demo: it reads its replicas from the DHT every announce period, from the training loop
            peer = local.start_peer("lone", "0", [*LONE, "--sync", "demo", "--max-steps", "100000"])
            wait_for(lambda: any(h.announcement.public_name == "lone" and h.announcement.step > 5
                                 for h in client.directory.hosts(0)), 90, "the peer training")  # fmt: skip
            bootstrap = local.started[0]
            stalled = [dht_child(peer.process.pid), dht_child(bootstrap.process.pid)]
            for process in stalled:
                process.suspend()  # their own DHT: every get and store of theirs now times out (after 2 s)
            try:
                wait_for(lambda: "on the DHT failed" in peer.log(), 60, "the peer to meet a DHT timeout")
                wait_for(lambda: "refresh skipped" in bootstrap.log(), 60, "the bootstrap to meet one")
            finally:
                for process in stalled:
                    process.resume()
            assert peer.process.poll() is None and bootstrap.process.poll() is None
            before = wait_for(lambda: [h.announcement.step for h in client.directory.hosts(0)
                                       if h.announcement.public_name == "lone"],
                              30, "the peer's record again")[0]  # fmt: skip
            wait_for(lambda: any(h.announcement.public_name == "lone" and h.announcement.step > before + 5
                                 for h in client.directory.hosts(0)), 60, "the peer to train on")  # fmt: skip


def test_a_stopped_peer_ends_every_process_it_started_whatever_its_dht_is_doing(lent_swarm):
    local, client = lent_swarm
    peer = local.start_peer("lone", "0", [*LONE, "--max-steps", "100000"])
    wait_for(lambda: any(h.announcement.public_name == "lone" and h.announcement.state == "training"
                         for h in client.directory.hosts(0)), 90, "the peer training")  # fmt: skip
    dht = dht_child(peer.process.pid)
    family = [dht, *dht.children(recursive=True)]
    dht.suspend()  # it cannot shut down gracefully, nor act on SIGTERM
    assert local.stop(peer, signal.SIGTERM, timeout=40) == 0, peer.log()[-2000:]  # SIGKILLed (and failed) past 40 s
    assert "peer stopped" in peer.log()
    assert not [p for p in family if running(p)]


def test_a_child_process_that_inherited_the_peers_signal_handler_still_dies_of_sigterm(lent_swarm):
    local, client = lent_swarm
    peer = local.start_peer("lone", "0", LONE)
    wait_for(lambda: any(h.announcement.public_name == "lone" for h in client.directory.hosts(0)), 90, "the peer")
    dht = dht_child(peer.process.pid)
    dht.terminate()  # the peer's handler (stop after this step) must not make its DHT shrug this off
    wait_for(lambda: not running(dht), 10, "the DHT process to die of SIGTERM")
    local.stop(peer, signal.SIGKILL)


def _start_a_grandchild_and_wait(pids) -> None:
    """A forked child's life: start a process of its own (as a DHT starts its libp2p daemon), say
    its pid, and ignore everything after (as a hung DHT ignores its shutdown)."""
    pids.put(subprocess.Popen(["sleep", "600"]).pid)
    time.sleep(600)


def test_stopping_a_child_that_ignores_its_shutdown_kills_it_and_every_process_it_started():
    """`stop_child` alone, on real processes: a forked child that ignores its graceful shutdown
    is killed, and so is the process it started, which its death alone would leave running."""
    context = multiprocessing.get_context("fork")  # as hivemind's DHT is started
    pids = context.SimpleQueue()
    child = context.Process(target=_start_a_grandchild_and_wait, args=(pids,), daemon=True)
    child.start()
    grandchild = psutil.Process(pids.get())
    try:
        stop_child(child, graceful=lambda: None, timeout=1.0)
        assert not child.is_alive()
        wait_for(lambda: not running(grandchild), 10, "the process it started to die")  # SIGKILL is not instant
    finally:
        if running(grandchild):
            grandchild.kill()


def test_a_peer_behind_nat_that_no_relay_will_take_says_so_and_announces_nothing(tmp_path):
    config_path, corpus_path = write_tiny_setup(tmp_path)
    with LocalSwarm(tmp_path, swarm="norelay", config_path=config_path, data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2, extra=["--no-relay"])  # the only initial peer relays for nobody
        with local.client() as client:
            args = local.peer_args("stranded", "0", ["--reachability", "relayed", "--announce-period", "1"])
            stranded = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120,
                                      cwd=local.workdir)
            assert_one_line_error(stranded, "cannot be reached", "no relay")
            assert not client.directory.hosts(0)


def test_a_peer_started_before_its_initial_peer_joins_once_that_one_is_up(tmp_path, caplog):
    """The libp2p daemon gives up at once when it reaches none of the initial peers; `start_dht`
    starts it anew until its start timeout, so a bootstrap node that is up three seconds later
    is joined (before, the peer exited with "could not join the DHT")."""
    identity = tmp_path / "late.id"
    P2P.generate_identity(str(identity))
    with socket.socket() as probe:  # a port nothing listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"/ip4/127.0.0.1/tcp/{port}"
    late: list[DHT] = []
    starter = threading.Timer(
        3.0, lambda: late.append(DHT(host_maddrs=[address], identity_path=str(identity), start=True))
    )
    starter.start()
    joined = None
    try:
        with caplog.at_level(logging.WARNING, logger="swarm.p2p.network"):
            initial = f"{address}/p2p/{PeerID.from_identity(identity.read_bytes())}"
            joined = start_dht("late", NetworkOptions(initial_peers=[initial], host_maddrs=["/ip4/127.0.0.1/tcp/0"]))
        assert "reached none of the initial peers" in caplog.text  # it did start before the other was up
    finally:
        starter.join()
        for dht in [*late, joined]:
            if dht is not None:
                dht.shutdown()
