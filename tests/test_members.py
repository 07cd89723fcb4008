"""Invite-only swarms without a network: certificates and proofs, the directory's and the services'
checks, the creator's commands. Each refusal has its own test, which fails if its check alone is
removed from `Membership.refusal` (tried once per check; see docs/decisions.md).

The swarm test (a members-only swarm of real peers) is tests/test_members_swarm.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import TINY
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.p2p import PeerID
from hivemind.proto import runtime_pb2
from hivemind.utils.crypto import RSAPrivateKey

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p import members
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.gate import MemberGate
from swarm.p2p.limits import NOT_A_MEMBER
from swarm.p2p.members import DAY_S, Membership, certificate_id, issue, prove
from swarm.p2p.messages import (
    ChunkListReply,
    ChunkListRequest,
    DenoiseRequest,
    PayloadReply,
    PayloadRequest,
    PeerInfo,
    refusal,
)
from swarm.p2p.records import BlockAnnouncement, ModelRecord, RevocationList, owner_fingerprint, parse_record

SWARM = "club"
ALICE_PEER, MALLORY_PEER = "12D3KooWAlice", "12D3KooWMallory"


def subkey(key: RSAPrivateKey) -> bytes:
    """The DHT subkey a record signed with `key` is stored under."""
    return RSASignatureValidator(key).local_public_key


@pytest.fixture(scope="module")
def keys() -> SimpleNamespace:
    """The creator, a member (alice) and a stranger (mallory); RSA keys take a moment to make."""
    return SimpleNamespace(creator=RSAPrivateKey(), alice=RSAPrivateKey(), mallory=RSAPrivateKey())


@pytest.fixture
def membership(keys) -> Membership:
    rules = Membership(SWARM)
    rules.set_terms(subkey(keys.creator), members_only=True)
    return rules


def alice_proof(keys, **issued) -> members.MemberProof:
    certificate = issue(keys.creator, issued.pop("swarm", SWARM), "alice", keys.alice.get_public_key(), **issued)
    return prove(keys.alice, certificate, ALICE_PEER)


# --- certificates and proofs ---------------------------------------------------------------------------


def test_a_member_counts_and_a_stranger_does_not_and_an_open_swarm_takes_everyone(keys, membership):
    proof = alice_proof(keys, valid_days=1)
    assert membership.refusal(proof, ALICE_PEER, subkey(keys.alice)) is None
    assert membership.refusal(None, MALLORY_PEER) == "no member certificate"
    open_swarm = Membership(SWARM)
    open_swarm.set_terms(subkey(keys.creator), members_only=False)
    assert open_swarm.admits(None, MALLORY_PEER) and not membership.admits(None, MALLORY_PEER)


def test_a_forged_certificate_is_refused(keys, membership):
    """Signed by a key that is not the creator's, or changed after the creator signed it."""
    forged = issue(keys.mallory, SWARM, "mallory", keys.mallory.get_public_key(), valid_days=1)
    self_signed = prove(keys.mallory, forged, MALLORY_PEER)
    assert membership.refusal(self_signed, MALLORY_PEER) == "the certificate is not signed by the swarm's creator"
    honest = issue(keys.creator, SWARM, "mallory", keys.mallory.get_public_key(), valid_days=1)
    longer = honest.model_copy(update={"expires": honest.expires + 3650 * DAY_S})
    assert membership.refusal(prove(keys.mallory, longer, MALLORY_PEER), MALLORY_PEER) == (
        "the certificate is not signed by the swarm's creator"
    )


def test_a_certificate_of_another_swarm_is_refused(keys, membership):
    """The creator's own signature, for its other swarm: replayed here, it proves nothing."""
    proof = alice_proof(keys, swarm="otherclub", valid_days=1)
    assert membership.refusal(proof, ALICE_PEER) == "a certificate for swarm 'otherclub', not 'club'"


def test_a_certificate_carried_in_a_record_of_another_key_is_refused(keys, membership):
    """Mallory copies alice's whole proof (and her peer id) into a record signed with its own key."""
    record = BlockAnnouncement(peer_id=ALICE_PEER, state="training", step=0, membership=alice_proof(keys, valid_days=1))
    assert not membership.admits_record(record, subkey(keys.mallory))
    assert membership.refusal(record.membership, ALICE_PEER, subkey(keys.mallory)) == (
        "the certificate names another key than the one that signed the record"
    )
    assert membership.admits_record(record, subkey(keys.alice))


def test_a_proof_replayed_by_another_peer_is_refused(keys, membership):
    """Mallory's peer answers rpc_info with alice's proof: the signature is over alice's peer id."""
    proof = alice_proof(keys, valid_days=1)
    assert membership.refusal(proof, MALLORY_PEER) == "the certified key did not sign this peer id"
    borrowed = prove(keys.mallory, proof.certificate, MALLORY_PEER)  # its own key cannot sign for alice's
    assert membership.refusal(borrowed, MALLORY_PEER) == "the certified key did not sign this peer id"


def test_an_expired_certificate_is_refused(keys, membership):
    proof = alice_proof(keys, valid_days=1, now=time.time() - 2 * DAY_S)
    assert membership.refusal(proof, ALICE_PEER) == "the certificate of 'alice' has expired"
    assert membership.refusal(proof, ALICE_PEER, now=time.time() - 1.5 * DAY_S) is None  # it was good then


def test_a_revoked_certificate_is_refused(keys, membership):
    proof = alice_proof(keys, valid_days=1)
    membership.set_revoked(RevocationList(revoked=("0" * 32,)))
    assert membership.refusal(proof, ALICE_PEER) is None  # another certificate's revocation
    membership.set_revoked(RevocationList(revoked=("0" * 32, certificate_id(proof.certificate))))
    assert membership.refusal(proof, ALICE_PEER) == "the certificate of 'alice' was revoked"


def test_certificates_and_revocations_that_break_their_schema_do_not_parse(keys):
    good = alice_proof(keys, valid_days=1).certificate.model_dump()
    for bad in ({"name": "\x1b[31mred"}, {"name": "x" * 65}, {"member": "ssh-ed25519 AAAA"}, {"swarm": "a.b"},
                {"expires": "soon"}, {"signature": "x" * 2000}):  # fmt: skip
        assert parse_record(members.MemberCertificate, {**good, **bad}) is None, bad
    assert parse_record(RevocationList, {"revoked": ["not hex"]}) is None
    assert parse_record(RevocationList, {"revoked": ["0" * 32] * 1025}) is None
    assert parse_record(RevocationList, {"revoked": ["0" * 32]}) is not None


def test_a_certificate_cannot_be_issued_with_a_name_or_validity_it_cannot_hold(keys):
    with pytest.raises(SwarmError, match="--name"):
        issue(keys.creator, SWARM, "", keys.alice.get_public_key(), 1)
    with pytest.raises(SwarmError, match="--valid-days"):
        issue(keys.creator, SWARM, "alice", keys.alice.get_public_key(), 0)


# --- the directory: records of non-members are skipped ---------------------------------------------------


def entry(value: object) -> SimpleNamespace:
    return SimpleNamespace(value=value, expiration_time=time.time() + 60)


def directory_of(keys, members_only: bool, revoked: tuple[str, ...] = (),
                 creator: str | None = None) -> tuple[SwarmDirectory, dict]:  # fmt: skip
    """A directory of swarm `club` whose DHT reads come from a dict (key -> entries by subkey);
    `creator`: the fingerprint its join line pins."""
    config = ModelConfig(**TINY)
    model = ModelRecord(config=config.to_dict(), config_hash=config.hash(), members_only=members_only)
    dht = {f"{SWARM}.model": {subkey(keys.creator): entry(model.model_dump())},
           f"{SWARM}.revoked": {subkey(keys.creator): entry({"revoked": list(revoked)}),
                                subkey(keys.mallory): entry({"revoked": []})}}  # fmt: skip
    directory = SwarmDirectory(dht=None, swarm=SWARM, private_key=keys.alice, creator=creator)
    directory._entries = lambda key: dht.get(key, {})
    return directory, dht


def test_the_directory_skips_records_of_keys_without_a_valid_certificate_in_a_members_only_swarm(keys):
    directory, dht = directory_of(keys, members_only=True)
    member = BlockAnnouncement(peer_id=ALICE_PEER, state="training", step=3, membership=alice_proof(keys, valid_days=1))
    stranger = BlockAnnouncement(peer_id=MALLORY_PEER, state="training", step=9)
    copier = member.model_copy(update={"peer_id": MALLORY_PEER})  # alice's proof, under mallory's key and id
    dht[f"{SWARM}.block.0"] = {subkey(keys.alice): entry(member.model_dump()),
                               subkey(keys.mallory): entry(stranger.model_dump()),
                               subkey(keys.creator): entry(copier.model_dump())}  # fmt: skip
    assert len(directory.hosts(0)) == 3  # before the model record is read, the swarm is taken as open
    assert directory.read_model() == ModelConfig(**TINY) and directory.membership.members_only
    hosts, skipped = directory.census(0)
    assert [h.peer_id for h in hosts] == [ALICE_PEER] and skipped == 2


def test_an_open_swarm_counts_every_record(keys):
    directory, dht = directory_of(keys, members_only=False)
    dht[f"{SWARM}.block.0"] = {subkey(keys.mallory): entry(BlockAnnouncement(peer_id=MALLORY_PEER, state="training",
                                                                             step=9).model_dump())}  # fmt: skip
    directory.read_model()
    assert [h.peer_id for h in directory.hosts(0)] == [MALLORY_PEER]


def test_revocations_are_read_from_the_creators_entry_alone(keys):
    proof = alice_proof(keys, valid_days=1)
    directory, dht = directory_of(keys, members_only=True, revoked=(certificate_id(proof.certificate),))
    dht[f"{SWARM}.revoked"][subkey(keys.mallory)] = entry({"revoked": ["1" * 32]})
    directory.read_model()  # a members-only swarm's model record: the revocations are read with it
    assert directory.membership.revoked == {certificate_id(proof.certificate)}
    record = BlockAnnouncement(peer_id=ALICE_PEER, state="training", step=1, membership=proof)
    dht[f"{SWARM}.block.0"] = {subkey(keys.alice): entry(record.model_dump())}
    assert directory.hosts(0) == []


def test_a_members_only_record_from_an_unpinned_second_key_is_refused(keys):
    """Without --creator, a second key's model record would make that key the creator of its choice."""
    directory, dht = directory_of(keys, members_only=True)
    dht[f"{SWARM}.model"][subkey(keys.mallory)] = dht[f"{SWARM}.model"][subkey(keys.creator)]
    with pytest.raises(SwarmError, match="--creator"):
        directory.read_model()


def test_a_model_record_of_another_key_is_ignored_by_a_directory_that_pins_the_creator(keys):
    """An open swarm (no certificate involved): a second key's record of another model, read first."""
    directory, dht = directory_of(keys, members_only=False, creator=owner_fingerprint(subkey(keys.creator)))
    other = ModelConfig(**{**TINY, "n_blocks": 1, "n_layers": 2})
    hijack = ModelRecord(config=other.to_dict(), config_hash=other.hash()).model_dump()
    dht[f"{SWARM}.model"] = {subkey(keys.mallory): entry(hijack), **dht[f"{SWARM}.model"]}
    assert directory.read_model() == ModelConfig(**TINY)


# --- the services' gate ----------------------------------------------------------------------------------


class Asked:
    """A fake `rpc_info` of several peers, counting the questions."""

    def __init__(self, answers: dict):
        self.answers, self.count = answers, 0

    async def __call__(self, peer_id: PeerID) -> PeerInfo:
        self.count += 1
        answer = self.answers[peer_id]
        if isinstance(answer, Exception):
            raise answer
        return answer


def peer(name: str) -> PeerID:
    return PeerID(name.encode().ljust(34, b"\0"))


def test_the_gate_admits_a_member_once_asked_and_refuses_strangers_copiers_and_the_revoked(keys, membership):
    alice, mallory, silent = peer("alice"), peer("mallory"), peer("silent")
    certificate = issue(keys.creator, SWARM, "alice", keys.alice.get_public_key(), 1)
    alice_info = PeerInfo(owner=subkey(keys.alice), membership=prove(keys.alice, certificate, alice.to_base58()))
    copied = PeerInfo(owner=subkey(keys.alice), membership=alice_info.membership)  # alice's answer, from mallory
    asked = Asked({alice: alice_info, mallory: copied, silent: TimeoutError()})
    gate = MemberGate(membership, asked)

    async def admits(*callers: PeerID) -> list[bool]:
        return [await gate.admits(caller) for caller in callers]

    assert asyncio.run(admits(alice, alice, mallory, silent)) == [True, True, False, False]
    assert asked.count == 3  # alice was asked once
    membership.set_revoked(RevocationList(revoked=(certificate_id(certificate),)))
    assert asyncio.run(admits(alice)) == [False] and asked.count == 3  # at once, without asking again


def test_every_service_refuses_a_caller_its_gate_refuses(tiny_config, tmp_path):
    """The chokepoints: checkpoint lists and downloads, sync payloads, remote denoising."""
    from swarm.checkpoints.store import CheckpointStore
    from swarm.checkpoints.transfer import BlockServicer
    from swarm.serving.server import DenoiseServicer
    from swarm.sync.transport import PayloadServicer

    class Closed:
        async def admits(self, peer_id: PeerID) -> bool:
            return False

    context = SimpleNamespace(remote_id=peer("mallory"))
    store = CheckpointStore(tmp_path, tiny_config, 0, SWARM)
    chunk_list = ChunkListRequest(block=0, sha256="0" * 64).encode()
    payload = PayloadRequest(block=0, step=1).encode()
    denoise = DenoiseRequest(block=0).encode()

    async def answers() -> tuple:
        def request(metadata: bytes) -> runtime_pb2.ExpertRequest:
            return runtime_pb2.ExpertRequest(metadata=metadata)

        listed = await BlockServicer(0, store, Closed()).rpc_chunk_list(request(chunk_list), context)
        polled = await PayloadServicer(0, 0.1, Closed()).rpc_payload(request(payload), context)
        denoised = await DenoiseServicer(tiny_config, 0, Closed()).rpc_denoise(request(denoise), context)
        return listed, polled, denoised

    listed, polled, denoised = asyncio.run(answers())
    assert ChunkListReply.decode(listed.metadata).error == NOT_A_MEMBER
    assert PayloadReply.decode(polled.metadata).status == "not a member"
    assert refusal(denoised) == NOT_A_MEMBER and not denoised.tensors


# --- the creator's commands ------------------------------------------------------------------------------


def bootstrap(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run swarm-bootstrap in this process (as its console script would): exit status, stdout, stderr."""
    from swarm_bootstrap.main import main

    monkeypatch.setattr(sys, "argv", ["swarm-bootstrap", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def test_keygen_invite_and_revoke_write_what_a_member_joins_with(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    members.write_key_pair("creator.key")  # what --new-swarm made
    assert bootstrap(monkeypatch, capsys, "keygen", "alice.key")[0] == 0
    status, out, _ = bootstrap(monkeypatch, capsys, "invite", "--name", "alice", "--member-key", "alice.key.pub",
                               "--out", "alice.cert", "--swarm", SWARM, "--valid-days", "30")  # fmt: skip
    assert status == 0 and "alice.cert" in out
    credentials = members.load_credentials("alice.key", "alice.cert")
    assert credentials.certificate.name == "alice" and credentials.certificate.swarm == SWARM
    assert abs(credentials.certificate.expires - time.time() - 30 * DAY_S) < 60
    assert oct((tmp_path / "alice.key").stat().st_mode & 0o777) == "0o600"
    assert bootstrap(monkeypatch, capsys, "revoke", "alice.cert")[0] == 0
    assert json.loads((tmp_path / "revoked.json").read_text())["revoked"] == [certificate_id(credentials.certificate)]
    assert members.read_revocations("revoked.json").revoked == (certificate_id(credentials.certificate),)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["invite", "--name", "bob", "--member-key", "missing.pub", "--out", "b.cert"], "missing.pub"),
        (["invite", "--name", "bob", "--member-key", "creator.key", "--out", "b.cert", "--creator-key", "none.key"],
         "no creator key none.key"),
        (["invite", "--name", "bob", "--member-key", "garbage.pub", "--out", "b.cert"], "not a member key"),
        (["invite", "--name", "", "--member-key", "creator.key", "--out", "b.cert"], "--name"),
        (["invite", "--name", "bob", "--member-key", "creator.key", "--out", "b.cert", "--valid-days", "-1"],
         "--valid-days"),
        (["invite", "--name", "bob", "--member-key", "creator.key", "--out", "b.cert", "--swarm", "a.b"], "no dots"),
        (["invite", "--name", "bob", "--member-key", "creator.key", "--out", "creator.key/b.cert"], "cannot write"),
        (["invite", "--name", "bob"], "--member-key"),
        (["revoke"], "its file, or --id"),
        (["revoke", "--id", "xyz"], "--id"),
        (["revoke", "garbage.pub"], "not a member certificate"),
        (["keygen", "creator.key"], "never overwritten"),
        (["--members-only", "--swarm", "club"], "--new-swarm"),
    ],
)  # fmt: skip
def test_bad_input_to_the_creators_commands_is_one_line_and_a_nonzero_exit(tmp_path, monkeypatch, capsys, args,
                                                                           fragment):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    members.write_key_pair("creator.key")
    (tmp_path / "garbage.pub").write_text("not a key at all")
    status, _, err = bootstrap(monkeypatch, capsys, *args)
    assert status != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and fragment in lines[0], err
