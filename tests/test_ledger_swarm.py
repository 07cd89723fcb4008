"""The ledger in a small swarm of real processes: three DeMo replicas of block 0 attest each
other's payloads and uptime, and every replica ends credited by two keys other than its own, in
`swarm-status --contributions`, its CSV, and the health page's state. The counting rules alone
are tests/test_ledger.py."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import assert_one_line_error
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from swarm_helpers import FAST_PEER, wait_for, write_tiny_setup

from swarm.health.state import SwarmMonitor
from swarm.lab.launch import LocalSwarm
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.ledger import Ledger, sign
from swarm.p2p.members import Membership
from swarm.p2p.records import Contribution, ledger_key, owner_fingerprint
from swarm.waiting import WaitTimeout

SWARM = "ledgerswarm"
REPLICAS = ("alice", "bob", "carol")
TRAIN = ["--max-steps", "8", "--save-every", "4", "--announce-period", "1", "--sync", "demo", "--sync-deadline", "3",
         "--average-every", "0", "--wait-for-replicas", "3"]  # fmt: skip


def contributions(local: LocalSwarm, *args: str) -> list[dict]:
    result = local.run("swarm-status", "--contributions", "--json", *args, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["contributions"]


def test_replicas_are_credited_what_two_other_keys_attest(tmp_path):
    config_path, corpus_path = write_tiny_setup(tmp_path)
    with LocalSwarm(tmp_path, swarm=SWARM, config_path=config_path, data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2)
        for name in REPLICAS:
            local.start_peer(name, "0", [*TRAIN, "--public-name", name])
        local.start_peer("dave", "1", [*FAST_PEER, "--sync", "none", "--public-name", "dave"])
        with local.client() as client:
            config = client.directory.wait_for_model(30)
            serving = lambda: {h.announcement.public_name for h in client.directory.hosts(0) + client.directory.hosts(1)
                               if h.announcement.state == "serving"}  # fmt: skip
            wait_for(lambda: serving() == {*REPLICAS, "dave"}, 180, "every peer done training and serving")
            keys = {h.announcement.public_name: owner_fingerprint(h.owner) for h in client.directory.hosts(0)}
            seen: list[dict] = [{}]

            def credited() -> dict | None:
                seen[0] = rows = {r["name"]: r for r in contributions(local)}
                done = all(name in rows and rows[name]["accepted_payloads"] > 0 and rows[name]["uptime_s"] > 0
                           for name in REPLICAS)  # fmt: skip
                return rows if done else None

            try:
                rows = wait_for(credited, 60, "every replica credited payloads and uptime")
            except WaitTimeout:
                pytest.fail(f"not every replica is credited payloads and uptime by two keys: {seen[0]}")
            state = SwarmMonitor(client.directory, client.p2p, client.run, config).collect()

            csv_path = tmp_path / "out" / "ledger.csv"
            written = local.run("swarm-status", "--csv", str(csv_path), timeout=120)
            (tmp_path / "ledger.csv").write_text("a file, where a folder would be needed")
            bad = local.run("swarm-status", "--contributions", "--csv", str(tmp_path / "ledger.csv" / "x"), timeout=120)

    for name in REPLICAS:
        row = rows[name]
        assert row["key"] == keys[name]
        others = {keys[other][:12] for other in REPLICAS if other != name}
        assert others <= set(row["attesters"]), row  # both other replicas attest it
        assert keys[name][:12] not in row["attesters"]  # never itself
    assert "dave" not in rows or rows["dave"]["accepted_payloads"] == 0  # no replica: no payload of its was applied

    board = {r["name"]: r for r in state["contributions"]}
    assert {name: board[name]["key"] for name in REPLICAS} == {name: keys[name] for name in REPLICAS}
    assert all(board[name]["accepted_payloads"] > 0 for name in REPLICAS)

    assert written.returncode == 0, written.stderr
    with open(csv_path, newline="") as f:
        exported = {r["name"]: r for r in csv.DictReader(f)}
    assert all(int(exported[name]["accepted_payloads"]) > 0 for name in REPLICAS)
    assert exported["alice"]["key"] == keys["alice"]
    assert_one_line_error(bad, "cannot write the CSV file")


def test_a_ledger_of_a_real_dht_refuses_what_one_key_wrote_under_another():
    """Real DHT nodes: an attestation copied under another key's subkey never reaches a reader's
    ledger as that key's (hivemind's signature validator refuses it on store, and the ledger's own
    check refuses it where a node without validators holds it)."""
    bob, mallory = RSAPrivateKey(), RSAPrivateKey()
    loose = DHT(start=True)  # a node that validates nothing, as an old or hostile one would
    try:
        directory = SwarmDirectory(loose, SWARM, bob)
        rows = [Contribution(subject="a" * 32, peer_id="peer-alice", payloads=5)]
        attestation = sign(bob, SWARM, "peer-bob", rows, int(get_dht_time()))
        assert directory.attest(attestation, 60, wait=True)
        stolen = RSASignatureValidator(mallory).local_public_key
        assert loose.store(ledger_key(SWARM), attestation.model_dump(), get_dht_time() + 60, subkey=stolen)
        found = directory.attestations()
        assert set(found) == {directory.owner_subkey, stolen}
        ledger = Ledger(SWARM, Membership(SWARM))
        ledger.take(found)
    finally:
        loose.shutdown()
    assert set(ledger.latest) == {directory.owner_subkey}
    assert ledger.refusals[owner_fingerprint(stolen)].startswith("forged")
