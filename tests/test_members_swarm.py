"""A members-only swarm of real processes: strangers, expired and revoked members count for nothing.

One tiny swarm created with `--members-only`: alice and carol (members) train block 0 together,
bob (a member) block 1; `watcher` is a member's client (fetch, status, generation). Before
anyone joins, a stranger (a node in this process, with no certificate) announces itself as a
replica of block 0 in training, with a plausible checkpoint (trained on shuffled text), and
serves it, and a payload service that counts the polls it gets. alice and carol, in step, save
one file and so confirm each other's answers to the watcher's generation. The unit tests of each
check are tests/test_members.py.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch
from hivemind.p2p import PeerID
from hivemind.proto import runtime_pb2
from safetensors.torch import load_file
from swarm_helpers import poisoned_host, wait_for, write_tiny_setup

from swarm.checkpoints.choice import SpotCheck
from swarm.checkpoints.transfer import HostFailed, ask_chunk_list
from swarm.lab.hosting import CheckpointHost, InProcessNode
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_block
from swarm.model.families import local_runner
from swarm.model.generate import continue_text
from swarm.p2p.info import InfoServicer
from swarm.p2p.limits import NOT_A_MEMBER
from swarm.p2p.members import DAY_S, prove, read_certificate
from swarm.p2p.messages import DenoiseRequest, PayloadReply, PayloadRequest, PeerInfo, refusal
from swarm.p2p.network import load_key
from swarm.p2p.records import BlockAnnouncement
from swarm.serving.audit import LoneKeyAudit
from swarm.serving.remote import RemoteBlocks
from swarm.serving.server import DenoiseServicer
from swarm.sync.transport import PayloadServicer

SWARM = "clubtest"
STRANGER_STEP = 5  # a step a joiner would believe: just ahead of a fresh start, far from a lie
TRAIN = ["--max-steps", "12", "--save-every", "3", "--announce-period", "1", "--sync", "demo",
         "--sync-deadline", "3", "--average-every", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def club(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("members")
    config_path, corpus_path = write_tiny_setup(workdir)
    with LocalSwarm(workdir, swarm=SWARM, config_path=config_path, data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2, extra=["--members-only"])
        local.member_args = {name: local.invite(name) for name in ("alice", "bob", "carol", "watcher")}
        with local.client(credentials=local.credentials("watcher")) as client:
            config = client.directory.wait_for_model(30)
            assert client.directory.membership.members_only  # learnt from the creator's record
            with stranger_host(local, config) as stranger:
                pair = [*TRAIN, "--wait-for-replicas", "2"]
                peers = {
                    "alice": local.start_peer("alice", "0", [*pair, *local.member_args["alice"]]),
                    "carol": local.start_peer("carol", "0", [*pair, *local.member_args["carol"]]),
                    "bob": local.start_peer("bob", "1", [*TRAIN, *local.member_args["bob"]]),
                }
                wait_for(lambda: len(serving(client, 0)) == 2 and len(serving(client, 1)) == 1, 180,
                         "alice and carol serving block 0, bob block 1")  # fmt: skip
                yield local, client, config, stranger, peers


def stranger_host(local: LocalSwarm, config) -> CheckpointHost:
    """A node with no certificate that hosts a plausible, poisoned checkpoint of block 0 at step 5,
    announces itself as training that block, and counts the sync polls it is sent."""
    host, info = poisoned_host(local, config, STRANGER_STEP)
    host.payloads = PayloadServicer(0, deadline=3.0)
    host.serve(host.payloads)
    record = BlockAnnouncement(peer_id=host.peer_id, state="training", step=STRANGER_STEP, checkpoint=info)
    assert any(host.directory.announce(0, record, lifetime_s=900, wait=True) for _ in range(3))
    return host


def serving(client, block: int) -> list:
    return [h for h in client.directory.hosts(block) if h.announcement.state == "serving"]


def status_names(local: LocalSwarm, member: str = "watcher") -> set[str]:
    result = local.run("swarm-status", "--json", *local.member_args[member], timeout=60)
    assert result.returncode == 0, result.stderr
    return {row["public_name"] for row in json.loads(result.stdout)["hosts"]} - {""}


def members_client(local: LocalSwarm, node: InProcessNode, proof_of: str | None) -> None:
    """Make `node` answer rpc_info as `proof_of`'s peer would (None: with no proof)."""
    proof = local.credentials(proof_of).proof(node.peer_id) if proof_of else None
    node.serve(InfoServicer(lambda: PeerInfo(owner=node.directory.owner_subkey, membership=proof)))


def refusals(node: InProcessNode, host, config) -> dict[str, str]:
    """What `host`'s services answer `node`: its checkpoint list, a sync poll, a denoise request."""
    peer = PeerID.from_base58(host.peer_id)

    async def ask() -> dict[str, str]:
        answers = {}
        try:
            await ask_chunk_list(node.p2p, host, host.announcement.checkpoint, timeout=10)
            answers["checkpoint"] = "served"
        except HostFailed as error:
            answers["checkpoint"] = str(error)
        poll = runtime_pb2.ExpertRequest(metadata=PayloadRequest(block=host.block, step=0).encode())
        polled = await PayloadServicer.get_stub(node.p2p, peer).rpc_payload(poll, timeout=10)
        answers["payload"] = PayloadReply.decode(polled.metadata).status
        request = runtime_pb2.ExpertRequest(metadata=DenoiseRequest(block=host.block).encode())
        denoised = await DenoiseServicer.get_stub(node.p2p, peer).rpc_denoise(request, timeout=10)
        answers["denoise"] = refusal(denoised) or "served"
        return answers

    return node.loop.run(ask(), 40)


def test_members_train_together_and_a_stranger_is_ignored_by_joiners_sync_fetch_and_status(club):
    local, client, _, stranger, peers = club
    logs = [peers[name].log() for name in ("alice", "carol")]
    assert all(f"from replica {stranger.peer_id}" not in log for log in logs)  # nobody started from its step 5
    assert any(f"(peer {stranger.peer_id}): no member certificate" in log for log in logs)  # seen, and ignored
    assert stranger.payloads.bytes_received == 0  # no replica ever polled it: it was in nobody's replica list
    assert status_names(local) == {"alice", "carol", "bob"}
    assert stranger.peer_id not in {h.peer_id for h in client.directory.hosts(0)}
    carol = next(h for h in serving(client, 0) if h.announcement.public_name == "carol")
    assert carol.announcement.sync_steps > 0 and carol.announcement.step == 12  # trained normally, in step with alice
    fetched = local.run("swarm-fetch", "--out", "fetched", "--data", local.data, *local.member_args["watcher"])
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    manifest = json.loads((local.workdir / "fetched" / "manifest.json").read_text())
    assert stranger.peer_id not in manifest["blocks"]["0"]["vouched_by"]
    assert manifest["blocks"]["0"]["step"] == 12
    generated = local.run("swarm-generate", "--max-bytes", "8", "--data", local.data, *local.member_args["watcher"],
                          "hello")  # fmt: skip
    assert generated.returncode == 0, generated.stderr[-3000:]


def final_file(local: LocalSwarm, name: str, block: int) -> Path:
    """The step-12 checkpoint of `block` that the peer started as `name` saved."""
    return local.checkpoint_dir(name) / f"block_{block}_step_12.safetensors"


def test_replicas_in_step_announce_one_checkpoint_and_witness_each_others_answers(club):
    """alice and carol applied the same payloads at every step, so they hold bit-identical weights;
    saved to the same bytes, those announce one sha256 under two member keys. Where keys count, the
    watcher's generation then uses block 0's checkpoint as agreed on (never downloaded: only bob's
    lone block 1 is measured) and sends each of its requests to one of them and, at the same moment,
    to the other as its witness (replicas.py: witnesses are hosts of the same file). Every answer of
    bob's lone key is audited here (rate 1), so `lone_checked` counts his answers and none of block 0's.

    Without `safetensors_bytes`'s sorted header (swarm/model/checkpoint.py), safetensors writes the
    five metadata keys in a random order on each save (one chance in 120 of the same order): the two
    files differ, and so do their sha256s. Block 0 then has two checkpoints of one key each: both are
    downloaded and measured (checkpoints_measured 3, not 1), no witness shares either file
    (requests_checked and extra_requests 0, one host announcing the chosen one), and each block 0
    answer is a lone key's, audited like bob's (lone_checked 4, not 2). The generated text is the
    same either way: only what confirmed it tells the two apart."""
    local, client, config, _, _ = club
    replicas = {h.announcement.public_name: h.announcement for h in serving(client, 0)}
    alice, carol = replicas["alice"], replicas["carol"]
    in_step = (alice.sync_steps, carol.sync_steps, alice.drift, carol.drift)
    assert in_step == (12, 12, None, None), f"a payload missed its deadline (not this test's subject): {in_step}"
    weights = [load_file(final_file(local, name, 0)) for name in ("alice", "carol")]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])

    remote = RemoteBlocks(client.directory, client.p2p, client.loop, config, audit=LoneKeyAudit(rate=1.0),
                          spot_check=SpotCheck.from_source(local.data, config))  # fmt: skip
    spans = 2

    def generate(runner) -> bytes:
        return b"".join(continue_text(runner, config, b"The fox", spans * config.gen_len, 2, seed=3))

    through_swarm = generate(remote)
    blocks = [load_block(final_file(local, name, b), config, b)[0] for b, name in ((0, "alice"), (1, "bob"))]
    assert through_swarm == generate(local_runner(lambda b: blocks[b], config))

    checks, shas = remote.checks, (alice.checkpoint.sha256, carol.checkpoint.sha256)
    assert remote.round_trips == spans * config.n_blocks, checks  # no answer dropped or asked again
    assert checks.requests_checked == checks.extra_requests == spans, (checks, shas)  # each block 0 answer witnessed
    assert checks.checkpoints_measured == 1, (checks, shas)  # bob's; block 0's was agreed on by two keys
    assert checks.lone_checked == checks.computed_here == spans, (checks, shas)  # bob's answers alone
    assert checks.disagreements == checks.banned == checks.undecided == checks.unconfirmed == 0, checks
    assert {h.announcement.public_name for h in remote.replicas.chosen[0].announcing} == {"alice", "carol"}
    assert remote.used[0] == {alice.checkpoint.sha256}
    assert alice.checkpoint == carol.checkpoint  # one sha256, step and size, under two keys
    assert hashlib.sha256(final_file(local, "carol", 0).read_bytes()).hexdigest() == alice.checkpoint.sha256


def test_a_stranger_is_refused_by_every_service_and_a_member_is_served(club):
    local, client, config, stranger, _ = club
    alice = next(h for h in serving(client, 0) if h.announcement.public_name == "alice")
    assert refusals(stranger, alice, config) == {"checkpoint": f"peer {alice.peer_id} refused: {NOT_A_MEMBER}",
                                                 "payload": "not a member", "denoise": NOT_A_MEMBER}  # fmt: skip
    with InProcessNode(SWARM, local.initial_peers, key=local.credentials("watcher").key) as member:
        members_client(local, member, "watcher")
        answers = refusals(member, alice, config)
    assert answers["checkpoint"] == "served" and answers["payload"] != "not a member"
    assert answers["denoise"] != NOT_A_MEMBER  # refused for its empty tensors, not for who asked
    copier = InProcessNode(SWARM, local.initial_peers)  # alice's certificate, but not alice's key
    with copier:
        proof = local.credentials("alice").proof(alice.peer_id)
        copier.serve(InfoServicer(lambda: PeerInfo(owner=copier.directory.owner_subkey, membership=proof)))
        assert refusals(copier, alice, config)["payload"] == "not a member"


def test_a_peer_or_client_without_a_valid_certificate_cannot_take_part(club):
    local, *_ = club
    alone = local.run("swarm-peer", "--block", "0", "--max-steps", "1", "--checkpoint-dir", "alone", timeout=120)
    assert alone.returncode != 0 and "members-only" in alone.stderr
    unfetched = local.run("swarm-fetch", "--out", "unfetched", "--data", local.data, timeout=180)
    assert unfetched.returncode != 0  # it can read the records, but no member serves it a byte
    old = local.invite("old", valid_days=1, issued=time.time() - 2 * DAY_S)
    expired = local.run("swarm-peer", "--block", "0", "--max-steps", "1", "--checkpoint-dir", "old", *old, timeout=120)
    assert expired.returncode != 0 and "expired" in expired.stderr


def test_an_expired_member_is_ignored_like_a_stranger(club):
    local, client, config, _, _ = club
    local.invite("lapsed", valid_days=1, issued=time.time() - 2 * DAY_S)
    folder = local.workdir / "members"
    key, certificate = load_key(folder / "lapsed.key"), read_certificate(folder / "lapsed.cert")
    with InProcessNode(SWARM, local.initial_peers, key=key) as node:
        proof = prove(key, certificate, node.peer_id)
        node.serve(InfoServicer(lambda: PeerInfo(owner=node.directory.owner_subkey, membership=proof)))
        record = BlockAnnouncement(peer_id=node.peer_id, state="serving", step=12, public_name="lapsed",
                                   membership=proof)  # fmt: skip
        assert any(node.directory.announce(1, record, lifetime_s=300, wait=True) for _ in range(3))
        assert "lapsed" not in status_names(local)
        bob = next(h for h in serving(client, 1) if h.announcement.public_name == "bob")
        assert refusals(node, bob, config)["payload"] == "not a member"


def test_a_revoked_member_is_ignored_from_the_next_refresh_on(club):
    """Last: bob leaves the swarm's count for good."""
    local, client, config, _, peers = club
    bob = next(h for h in serving(client, 1) if h.announcement.public_name == "bob")
    with InProcessNode(SWARM, local.initial_peers, key=local.credentials("bob").key) as bobs_client:
        members_client(local, bobs_client, "bob")
        alice = next(h for h in serving(client, 0) if h.announcement.public_name == "alice")
        assert refusals(bobs_client, alice, config)["checkpoint"] == "served"  # a member, until revoked
        local.revoke("bob")
        wait_for(lambda: "bob" not in status_names(local), 90, "bob's revocation published and read")
        client.directory.read_revocations()
        assert bob.peer_id not in {h.peer_id for h in client.directory.hosts(1)}
        def refused() -> bool:
            return refusals(bobs_client, alice, config)["payload"] == "not a member"

        wait_for(refused, 15, "alice refusing bob's calls")  # she reads the revocations every announce period (1 s)
    assert peers["bob"].process.poll() is None  # bob still runs: it is ignored, not crashed
