"""The ledger of verified contributions (swarm/p2p/ledger.py), unit by unit: the counting rule
(two keys, no self-credit), and attestations that are forged, replayed, expired or not a member's.
The ledger in a swarm of real peers is tests/test_ledger_swarm.py."""

from __future__ import annotations

import functools

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.crypto import RSAPrivateKey

from swarm.p2p.ledger import Ledger, Witness, sign
from swarm.p2p.members import Membership, issue, prove
from swarm.p2p.records import (
    MAX_COUNT,
    MAX_SUBJECTS,
    Attestation,
    Contribution,
    SwarmRecordValidator,
    ledger_key,
    owner_fingerprint,
    parse_record,
)

SWARM = "ledgertest"
NOW = 1_900_000_000


@functools.cache
def key(name: str) -> RSAPrivateKey:
    """One RSA key per name, made once (a key takes a while to make)."""
    return RSAPrivateKey()


def subkey(name: str) -> bytes:
    """The DHT subkey a key writes under: it carries the key's public half."""
    return RSASignatureValidator(key(name)).local_public_key


def fingerprint(name: str) -> str:
    return owner_fingerprint(subkey(name))


def peer(name: str) -> str:
    return f"peer-{name}"


def attest(attester: str, issued: int = NOW, lifetime: int = 3600, **amounts: dict) -> Attestation:
    """`attester`'s signed attestation of `amounts`: subject name -> counters."""
    rows = [Contribution(subject=fingerprint(s), peer_id=peer(s), **counts) for s, counts in amounts.items()]
    return sign(key(attester), SWARM, peer(attester), rows, issued, lifetime)


def credit_of(ledger: Ledger, subject: str, now: float = NOW + 1):
    return next((c for c in ledger.credits(now) if c.key == fingerprint(subject)), None)


def ledger_of(*attestations: tuple[str, Attestation], now: float = NOW + 1, membership: Membership | None = None):
    ledger = Ledger(SWARM, membership or Membership(SWARM))
    for attester, attestation in attestations:
        ledger.take({subkey(attester): attestation}, now)
    return ledger


def test_one_key_alone_credits_nothing_and_one_liar_cannot_inflate_anyone():
    """Per kind, a key is credited the second-largest amount other keys attest."""
    alone = ledger_of(("bob", attest("bob", alice={"payloads": 10, "uptime_s": 60})))
    credit = credit_of(alone, "alice")
    assert (credit.payloads, credit.uptime_s) == (0, 0)
    assert credit.attesters == (fingerprint("bob"),)  # shown as attesting, crediting nothing alone

    two = ledger_of(("bob", attest("bob", alice={"payloads": 10, "uptime_s": 60})),
                    ("carol", attest("carol", alice={"payloads": 7, "answers": 3})))  # fmt: skip
    credit = credit_of(two, "alice")
    assert (credit.payloads, credit.answers, credit.uptime_s) == (7, 0, 0)  # answers and uptime: one key each
    assert set(credit.attesters) == {fingerprint("bob"), fingerprint("carol")}

    liar = ledger_of(("bob", attest("bob", alice={"payloads": 10})), ("carol", attest("carol", alice={"payloads": 7})),
                     ("mallory", attest("mallory", alice={"payloads": MAX_COUNT})))  # fmt: skip
    assert credit_of(liar, "alice").payloads == 10


def test_a_peer_cannot_credit_itself():
    """An attestation of the attester's own key, or of its own peer (under another key), counts
    for nothing: with one honest key beside it, nothing is credited."""
    own_key = ledger_of(
        ("alice", attest("alice", alice={"payloads": 50})), ("bob", attest("bob", alice={"payloads": 9}))
    )
    assert credit_of(own_key, "alice").payloads == 0
    assert credit_of(own_key, "alice").attesters == (fingerprint("bob"),)

    # a second key of alice's attests alice's key, naming alice's peer as the subject's and its own
    rows = [Contribution(subject=fingerprint("alice"), peer_id=peer("alice"), payloads=50)]
    second_key = sign(key("alice2"), SWARM, peer("alice"), rows, NOW)
    own_peer = ledger_of(("alice2", second_key), ("bob", attest("bob", alice={"payloads": 9})))
    assert credit_of(own_peer, "alice").payloads == 0


def test_forged_attestations_are_refused():
    """Altered after signing, signed for another swarm, or copied under another key's subkey."""
    honest = attest("bob", alice={"payloads": 10})
    altered = honest.model_copy(
        update={"contributions": (honest.contributions[0].model_copy(update={"payloads": 99}),)}
    )
    other_swarm = sign(key("bob"), "elsewhere", peer("bob"), list(honest.contributions), NOW)
    for forged, under in ((altered, "bob"), (other_swarm, "bob"), (honest, "mallory")):
        ledger = ledger_of((under, forged))
        assert ledger.latest == {}
        assert ledger.refusals[fingerprint(under)].startswith("forged")
    # the same, beside a second honest key: only the honest pair would credit alice
    ledger = ledger_of(("mallory", honest), ("carol", attest("carol", alice={"payloads": 8})))
    assert credit_of(ledger, "alice").payloads == 0


def test_a_replayed_older_attestation_is_refused_and_changes_nothing():
    newer = attest("bob", issued=NOW, alice={"payloads": 10})
    older = attest("bob", issued=NOW - 60, alice={"payloads": 3})
    ledger = ledger_of(("bob", newer), ("bob", older), ("carol", attest("carol", alice={"payloads": 10})))
    assert ledger.latest[subkey("bob")] == newer
    assert ledger.refusals[fingerprint("bob")].startswith("replayed")
    assert credit_of(ledger, "alice").payloads == 10


def test_expired_attestations_are_ignored():
    """One that expired is refused; one taken while it lived stops counting once it expires; one
    claiming to live longer than the bound, or issued in the future, is refused."""
    pair = [
        ("bob", attest("bob", lifetime=60, alice={"payloads": 10})),
        ("carol", attest("carol", alice={"payloads": 8})),
    ]
    ledger = ledger_of(*pair)
    assert credit_of(ledger, "alice").payloads == 8
    assert credit_of(ledger, "alice", now=NOW + 61).payloads == 0  # bob's expired since it was taken

    late = ledger_of(*pair, now=NOW + 61)
    assert late.refusals[fingerprint("bob")] == "expired" and subkey("bob") not in late.latest
    assert credit_of(late, "alice", now=NOW + 61).payloads == 0

    for bad in (
        attest("bob", lifetime=10 * 86400, alice={"payloads": 1}),
        attest("bob", issued=NOW + 3600, alice={"payloads": 1}),
    ):
        assert ledger_of(("bob", bad)).refusals[fingerprint("bob")] == "its times are out of bounds"


def test_in_a_members_only_swarm_only_certified_keys_attest():
    creator = key("creator")
    membership = Membership(SWARM)
    membership.set_terms(RSASignatureValidator(creator).local_public_key, members_only=True)
    certified = issue(creator, SWARM, "bob", key("bob").get_public_key(), valid_days=1, now=NOW - 10)
    rows = [Contribution(subject=fingerprint("alice"), peer_id=peer("alice"), payloads=10)]
    member = sign(key("bob"), SWARM, peer("bob"), rows, NOW, proof=prove(key("bob"), certified, peer("bob")))
    stranger = sign(key("carol"), SWARM, peer("carol"), rows, NOW)
    ledger = ledger_of(("bob", member), ("carol", stranger), membership=membership)
    assert set(ledger.latest) == {subkey("bob")}
    assert ledger.refusals[fingerprint("carol")] == "not a member: no member certificate"


def test_a_witness_attests_what_it_checked_of_peers_whose_key_it_knows():
    """Payloads are counted by peer id and attested once the peer's key is known (from its
    answer to a ping); uptime only between answers close enough; never its own peer."""
    witness = Witness(key("bob"), SWARM, peer("bob"), max_gap_s=5.0)
    witness.accepted([peer("alice"), peer("carol"), peer("bob")])
    for t in (100.0, 103.0, 120.0, 122.0):  # the 17 s gap is not uptime
        witness.answered(peer("alice"), subkey("alice"), now=t)
    witness.verified(peer("alice"), subkey("alice"), 12)
    witness.agreed(peer("alice"), subkey("alice"))
    attestation = witness.attestation(now=NOW)
    assert [c.peer_id for c in attestation.contributions] == [peer("alice")]  # carol's key is not known
    (c,) = attestation.contributions
    assert (c.subject, c.payloads, c.uptime_s, c.verified_step, c.answers) == (fingerprint("alice"), 1, 5, 12, 1)
    assert ledger_of(("bob", attestation)).latest == {subkey("bob"): attestation}  # signed as the ledger checks
    assert Witness(key("bob"), SWARM, peer("bob"), 5.0).attestation() is None  # nothing checked: nothing published


def test_a_witness_attests_nothing_of_a_key_it_caught_lying():
    """Issue 57: a generation client that shows a peer wrong with its own computation credits its
    key nothing, not what it counted before (a liar that answered honestly while it was checked),
    nor what any peer of that key does later; other keys keep their counts."""
    witness = Witness(key("bob"), SWARM, peer("bob"), max_gap_s=5.0)
    for name in ("alice", "mallory"):
        witness.agreed(peer(name), subkey(name))
    witness.agreed("mallory's second peer", subkey("mallory"))
    witness.caught(peer("mallory"), subkey("mallory"))
    witness.agreed(peer("mallory"), subkey("mallory"))
    witness.agreed("mallory's third peer", subkey("mallory"))
    attestation = witness.attestation(now=NOW)
    assert [(c.subject, c.answers) for c in attestation.contributions] == [(fingerprint("alice"), 1)]


def test_the_dht_refuses_attestations_out_of_schema_or_bounds():
    validator = SwarmRecordValidator(SWARM)
    good = attest("bob", alice={"payloads": 1}).model_dump()
    row = good["contributions"][0]
    bad = [
        {**good, "contributions": [row] * (MAX_SUBJECTS + 1)},
        {**good, "contributions": [{**row, "payloads": -1}]},
        {**good, "contributions": [{**row, "uptime_s": MAX_COUNT + 1}]},
        {**good, "contributions": [{**row, "answers": 1.5}]},
        {**good, "contributions": [{**row, "subject": "not a fingerprint"}]},
        {**good, "expires": "soon"},
    ]
    key_id = DHTID.generate(source=ledger_key(SWARM)).to_bytes()

    def record(value: dict, owner: bytes = subkey("bob")) -> DHTRecord:
        return DHTRecord(key_id, owner, DHTProtocol.serializer.dumps(value), expiration_time=NOW)

    assert validator.validate(record(good))
    assert not validator.validate(record(good, owner=b"no key here"))
    for value in bad:
        assert parse_record(Attestation, value) is None
        assert not validator.validate(record(value))


@pytest.mark.parametrize("name", ["=cmd|' /C calc'!A0", "+1", "-1", "@SUM(A1)"])
def test_the_csv_defuses_names_a_spreadsheet_would_run(tmp_path, name):
    from swarm.cli.status import write_csv

    row = {"key": "k" * 32, "name": name, "verified_steps": 1, "accepted_payloads": 2, "agreed_answers": 3,
           "uptime_s": 4, "attesters": ["a" * 12, "b" * 12]}  # fmt: skip
    write_csv(tmp_path / "out.csv", [row])
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert lines[0] == "key,name,verified_steps,accepted_payloads,agreed_answers,uptime_s,attesters"
    assert lines[1].split(",")[1].strip('"').startswith("'")
