"""The record a peer announces is built by the peer (`Peer.announcement`), from its figures alone."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from swarm import __version__
from swarm.p2p.records import CheckpointInfo
from swarm.peer.announcer import Announcer
from swarm.peer.life import Peer
from swarm.peer.served import Served


def a_peer(state: str) -> SimpleNamespace:
    """What `Peer.announcement` reads of a peer, without a swarm."""
    trainer = SimpleNamespace(losses=[9.0] * 30 + [4.0, 2.0] * 10, step_seconds=[0.5] * 20, step_count=12,
                              utilisation=lambda waited: 1.0 - waited / 10)  # fmt: skip
    sync = SimpleNamespace(steps=3, bytes_sent=100, bytes_received=80, round_seconds=0.2, wait_seconds=2.5)
    parts = SimpleNamespace(
        entered=SimpleNamespace(peer_id="12D3KooWpeer", reached="relayed", membership=None, work_nonce=7),
        claimed=None,
        replica=SimpleNamespace(trainer=trainer),
        synced=SimpleNamespace(sync=sync, averager=SimpleNamespace(bytes_sent=20), reconcile=None),
    )  # the records of its join (swarm/peer/parts.py)
    checkpoint = CheckpointInfo(step=10, sha256="a" * 64, size=1, chunks="b" * 64)
    return SimpleNamespace(state=state, parts=parts, served=Served(checkpoint, time=123.0),
                           config=SimpleNamespace(public_name="alice"))  # fmt: skip


def test_a_training_peer_announces_its_figures():
    record = Peer.announcement(a_peer("training"))
    assert (record.peer_id, record.state, record.step, record.checkpoint.step) == ("12D3KooWpeer", "training", 12, 10)
    assert record.loss == 3.0  # the last 20 steps' mean
    assert record.throughput == 2.0 and record.compute_utilisation == 0.75
    assert (record.sync_steps, record.sync_bytes_sent, record.sync_bytes_received) == (3, 120, 80)
    assert (record.public_name, record.reached, record.work_nonce, record.version) == (
        "alice",
        "relayed",
        7,
        __version__,
    )


def test_a_joining_peer_claims_no_progress():
    record = Peer.announcement(a_peer("joining"))
    assert record.state == "joining" and record.step == 0 and record.checkpoint is None


def test_the_start_barrier_counts_replicas_that_already_finished_training():
    """Two quick replicas of one block with --wait-for-replicas 2: if the first trains to its last step
    between two reads of the second, the second must still count it (it is done, so "serving"), or it
    waits out its whole join timeout; the sync exchange still asks only the ones training."""
    states = {"me": "training", "quick": "serving", "slow": "training", "new": "joining"}
    hosts = [SimpleNamespace(peer_id=p, announcement=SimpleNamespace(state=s)) for p, s in states.items()]
    directory = SimpleNamespace(hosts=lambda block: hosts)
    announcer = Announcer(directory, block=0, peer_id="me", period=1.0, record=None, stopping=threading.Event())
    announcer.read_replicas()
    assert announcer.replica_ids() == ["slow"]
    assert announcer.replicas_started() == 2
