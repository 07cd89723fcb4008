"""An open swarm whose creator prices an identity (swarm/p2p/work.py), with real processes.

The swarm is created with `--identity-work 3` at a cheap scrypt cost (a few microseconds a try).
Before anyone joins, a stranger (a node in this process) announces itself as a replica of block 0
in training with a plausible checkpoint (trained on shuffled text) that it serves, and a nonce
replayed from work done for another peer id. alice (block 0, with `--record-key` and
`--identity`) and bob (block 1) solve their own work, join and train. The units are
tests/test_identity_work.py.
"""

from __future__ import annotations

import json

import pytest
from swarm_helpers import FAST_PEER, poisoned_host, wait_for, write_tiny_setup

from swarm.errors import SwarmError
from swarm.lab.hosting import CheckpointHost, InProcessNode
from swarm.lab.launch import LocalSwarm
from swarm.p2p.records import BlockAnnouncement, IdentityWork, owner_fingerprint
from swarm.p2p.work import meets, solve

SWARM = "worktest"
PRICE = IdentityWork(bits=3, log2_n=4)
STRANGER_STEP = 5  # just ahead of a fresh start: a step a joiner would believe


@pytest.fixture(scope="module")
def priced_swarm(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("work")
    config_path, corpus_path = write_tiny_setup(workdir)
    with LocalSwarm(workdir, swarm=SWARM, config_path=config_path, data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2, extra=["--identity-work", str(PRICE.bits),
                                                       "--identity-work-memory", str(PRICE.log2_n)])  # fmt: skip
        with local.client() as client:
            config = client.directory.wait_for_model(30)
            assert client.directory.work.terms == PRICE  # learnt from the creator's record
            with stranger_host(local, config) as stranger:
                alice_key = local.workdir / "alice.key"
                alice = local.start_peer("alice", "0", [*FAST_PEER, "--record-key", str(alice_key),
                                                        "--identity", str(local.workdir / "alice.id")])  # fmt: skip
                bob = local.start_peer("bob", "1", FAST_PEER)
                wait_for(lambda: all(serving(client, b) for b in (0, 1)), 120, "alice and bob serving")
                yield local, client, config, stranger, {"alice": alice, "bob": bob, "alice_key": alice_key}


def stranger_host(local: LocalSwarm, config) -> CheckpointHost:
    """A node that serves a plausible, poisoned checkpoint of block 0 at step 5 and announces itself as
    training that block, with work solved for another peer id (replayed)."""
    host, info = poisoned_host(local, config, STRANGER_STEP)
    fingerprint = owner_fingerprint(host.directory.owner_subkey)
    replayed = replayed_nonce(fingerprint, host.peer_id)
    record = BlockAnnouncement(peer_id=host.peer_id, state="training", step=STRANGER_STEP, checkpoint=info,
                               work_nonce=replayed)  # fmt: skip
    assert any(host.directory.announce(0, record, lifetime_s=900, wait=True) for _ in range(3))
    return host


def replayed_nonce(fingerprint: str, peer_id: str) -> int:
    """Work of this key for another peer id, and not (by chance) work for `peer_id` too."""
    other = f"{peer_id}x"
    nonce = solve(PRICE, SWARM, fingerprint, other, show_progress=False)
    while meets(PRICE, SWARM, fingerprint, peer_id, nonce):
        nonce = solve(PRICE, SWARM, fingerprint, other + str(nonce), show_progress=False)
    return nonce


def serving(client, block: int) -> list:
    return [h for h in client.directory.hosts(block) if h.announcement.state == "serving"]


def test_a_record_without_its_own_work_is_ignored_by_joiners_and_fetch_and_peers_with_work_train(priced_swarm):
    local, client, _, stranger, peers = priced_swarm
    log = peers["alice"].log()
    assert f"from replica {stranger.peer_id}" not in log  # alice did not start from its step 5
    assert f"(peer {stranger.peer_id}): its identity work does not meet 3 bits" in log  # seen, and ignored
    assert stranger.peer_id not in {h.peer_id for h in client.directory.hosts(0)}
    assert client.directory.census(0)[1] >= 1  # counted as skipped
    alice = serving(client, 0)[0]
    assert alice.announcement.public_name == "alice" and alice.announcement.step == 6  # trained normally
    assert alice.announcement.work_nonce is not None
    assert (peers["alice_key"].parent / "alice.key.work").exists()  # kept for its next run
    fetched = local.run("swarm-fetch", "--out", "fetched", "--data", local.data)
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    manifest = json.loads((local.workdir / "fetched" / "manifest.json").read_text())
    assert stranger.peer_id not in manifest["blocks"]["0"]["vouched_by"]
    assert manifest["blocks"]["0"]["step"] == 6


def test_nobody_but_the_creator_can_lower_the_price(priced_swarm):
    local, client, config, stranger, _ = priced_swarm
    with InProcessNode(SWARM, local.initial_peers) as rival:
        assert rival.directory.publish_model(config, lifetime_s=300)  # the same model, identities free
        wait_for(lambda: len(rival.directory._entries(f"{SWARM}.model")) == 2, 30, "the rival's model record stored")
        assert client.directory.read_model() is not None
        assert client.directory.work.terms == PRICE  # the pinned creator's price stands
        assert stranger.peer_id not in {h.peer_id for h in client.directory.hosts(0)}
        with pytest.raises(SwarmError, match="different prices of an identity"):
            rival.directory.read_model()  # a reader that pins no creator refuses to guess
