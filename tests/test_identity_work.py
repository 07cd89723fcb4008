"""The price of an identity (swarm/p2p/work.py), one function at a time: the work, the replays it
refuses, the bounded cost of judging a flood, the file a peer keeps it in. The swarm test is
tests/test_identity_work_swarm.py."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError

from swarm.errors import SwarmError
from swarm.p2p import work
from swarm.p2p.records import BlockAnnouncement, IdentityWork, ModelRecord, owner_fingerprint
from swarm.p2p.work import WorkCheck, leading_zero_bits, meets, solve, stored_or_solved, work_path

CHEAP = IdentityWork(bits=8, log2_n=1, r=1)  # 256 tries of a few microseconds on average
SWARM = "worktest"
KEY_A, KEY_B = b"[owner:ssh-rsa AAAAkeyA]", b"[owner:ssh-rsa AAAAkeyB]"
PEER_A, PEER_B = "12D3KooWPeerA", "12D3KooWPeerB"


@pytest.fixture(scope="module")
def solved() -> int:
    """A nonce for (SWARM, KEY_A, PEER_A) at CHEAP: fixed inputs, so every run finds the same one."""
    return solve(CHEAP, SWARM, owner_fingerprint(KEY_A), PEER_A, show_progress=False)


def judged(check: WorkCheck, owner: bytes, peer_id: str, nonce: int | None) -> str | None:
    return check.refusals([(owner, peer_id, nonce)])[0]


def priced(terms: IdentityWork = CHEAP, swarm: str = SWARM) -> WorkCheck:
    check = WorkCheck(swarm)
    check.terms = terms
    return check


def test_leading_zero_bits_counts_from_the_first_byte():
    assert leading_zero_bits(bytes([0, 0x0F, 0xFF])) == 12
    assert leading_zero_bits(bytes([0x80, 0])) == 0
    assert leading_zero_bits(bytes(4)) == 32


def test_a_solved_nonce_meets_the_terms_and_its_predecessors_do_not(solved):
    fingerprint = owner_fingerprint(KEY_A)
    assert meets(CHEAP, SWARM, fingerprint, PEER_A, solved)
    assert not any(meets(CHEAP, SWARM, fingerprint, PEER_A, nonce) for nonce in range(solved))  # the first one


def test_work_counts_only_for_the_key_the_peer_and_the_swarm_it_was_solved_for(solved):
    assert judged(priced(), KEY_A, PEER_A, solved) is None
    refused = "its identity work does not meet 8 bits"
    assert judged(priced(), KEY_A, PEER_B, solved) == refused  # another peer id replaying it
    assert judged(priced(), KEY_B, PEER_A, solved) == refused  # another key
    assert judged(priced(swarm="otherswarm"), KEY_A, PEER_A, solved) == refused  # another swarm
    assert judged(priced(IdentityWork(bits=8, log2_n=2, r=1)), KEY_A, PEER_A, solved) == refused  # another cost
    assert judged(priced(), KEY_A, PEER_A, None) == "no identity work"


def test_an_unpriced_swarm_counts_every_record():
    assert judged(WorkCheck(SWARM), KEY_A, PEER_A, None) is None  # the model record not read, or no price
    assert judged(priced(IdentityWork(bits=0)), KEY_A, PEER_A, None) is None


def test_a_flood_of_bad_nonces_costs_a_bounded_number_of_tries_per_read(monkeypatch, solved):
    tries = []
    real = work.meets
    monkeypatch.setattr(work, "meets", lambda *args: tries.append(args) or real(*args))
    check = priced()
    flood = [(KEY_B, f"12D3KooWSybil{i}", i) for i in range(50)]
    refusals = check.refusals(flood)
    assert len(tries) == work.MAX_CHECKS_PER_READ
    assert refusals.count(work.NOT_CHECKED_YET) == 50 - work.MAX_CHECKS_PER_READ
    tries.clear()
    assert check.refusals([(KEY_A, PEER_A, solved)]) == [None]
    assert check.refusals([(KEY_A, PEER_A, solved)]) == [None]
    assert len(tries) == 1  # judged once, then remembered


def test_the_judged_nonces_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(work, "CACHE_SIZE", 10)
    check = priced()
    for i in range(30):
        check.refusals([(KEY_B, PEER_B, i)])
    assert len(check._judged) == 10


def test_the_creator_states_the_price_in_the_signed_model_record_and_it_is_bounded():
    record = ModelRecord.model_validate({"config": {}, "config_hash": "0" * 64, "identity_work": {"bits": 12}})
    assert record.identity_work == IdentityWork(bits=12, log2_n=14, r=8)
    assert ModelRecord.model_validate({"config": {}, "config_hash": "0" * 64}).identity_work is None  # older records
    with pytest.raises(ValidationError):
        IdentityWork(bits=41)
    with pytest.raises(ValidationError):
        IdentityWork(bits=12, log2_n=20, r=8)  # 1 GiB a try: every reader would pay it
    with pytest.raises(ValidationError):
        BlockAnnouncement(peer_id=PEER_A, state="training", step=0, work_nonce=-1)


def test_a_peer_solves_once_and_reads_its_work_back_on_restart(tmp_path, solved):
    path = work_path(tmp_path / "peer.key")
    assert path.name == "peer.key.work"
    fingerprint = owner_fingerprint(KEY_A)
    assert stored_or_solved(path, CHEAP, SWARM, fingerprint, PEER_A) == solved
    assert path.exists() and path.stat().st_mode & 0o777 == 0o600

    def never(*args):
        raise AssertionError("solved again")

    assert stored_or_solved(path, CHEAP, SWARM, fingerprint, PEER_A, solver=never) == solved
    with pytest.raises(AssertionError, match="solved again"):  # another peer id needs work of its own
        stored_or_solved(path, CHEAP, SWARM, fingerprint, PEER_B, solver=never)


def test_kept_work_is_checked_not_believed(tmp_path, solved):
    path = work_path(tmp_path / "peer.key")
    fingerprint = owner_fingerprint(KEY_A)
    stored_or_solved(path, CHEAP, SWARM, fingerprint, PEER_A)
    path.write_text(path.read_text().replace(f'"nonce": {solved}', f'"nonce": {solved + 1}'))
    assert stored_or_solved(path, CHEAP, SWARM, fingerprint, PEER_A, solver=lambda *a: 7) == 7
    path.write_text("not json")
    with pytest.raises(SwarmError, match="not a file of solved identity work"):
        stored_or_solved(path, CHEAP, SWARM, fingerprint, PEER_A)


def test_a_stop_ends_the_search():
    stopping = threading.Event()
    stopping.set()
    assert solve(IdentityWork(bits=40, log2_n=1, r=1), SWARM, "f", PEER_A, stopping, show_progress=False) is None
