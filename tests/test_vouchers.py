"""Issue 46: who vouches for a checkpoint. Keys the swarm's ledger credits are measured first, so a
flood of fresh keys cannot keep a host with checked work unmeasured; and a host whose record says it
took its checkpoint from one key alone is that key's voice, so an honest joiner that adopted a
stranger's block does not launder it into agreement.

Each scenario has one honest host, so that agreement among honest hosts cannot save the result:
only the rule under test can.
"""

from __future__ import annotations

import functools
import json
import math
import time
from types import SimpleNamespace

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey
from swarm_helpers import HOSTS_SWARM, client_of

from swarm.checkpoints.choice import (
    MEASURED_AT_MOST,
    Candidate,
    Choice,
    Measured,
    SpotCheck,
    by_evidence,
    choose_checkpoint,
    rank,
)
from swarm.checkpoints.measure import vouchers_among
from swarm.checkpoints.spot_check import Losses
from swarm.checkpoints.store import CheckpointStore
from swarm.model.checkpoint import encode_block
from swarm.model.denoiser import ModelConfig
from swarm.model.train import TrainConfig, block_trainer, train
from swarm.p2p.directory import DHTUnavailable, Host
from swarm.p2p.ledger import backed_keys, sign
from swarm.p2p.members import Membership
from swarm.p2p.records import (
    MAX_TAKEN_FROM,
    Attestation,
    BlockAnnouncement,
    CheckpointInfo,
    Contribution,
    owner_fingerprint,
    parse_record,
)
from swarm.peer.served import Served
from swarm.peer.start import start_from
from swarm.serving.vetting import Vetting

BAD, GOOD = "b" * 64, "a" * 64  # the sha256 of a stranger's checkpoint, and of the honest one


def voice(key: str) -> str:
    """The fingerprint of the key `host(key, ...)` writes under."""
    return owner_fingerprint(key.encode())


def host(key: str, step: int, sha: str, taken_from: tuple[str, ...] = (), peer_id: str | None = None) -> Host:
    """A serving host under key `key` announcing the checkpoint `sha` at `step`, taken from `taken_from`."""
    info = CheckpointInfo(step=step, sha256=sha, size=1000, chunks=sha)
    announcement = BlockAnnouncement(peer_id=peer_id or key, state="serving", step=step, checkpoint=info,
                                     taken_from=taken_from)  # fmt: skip
    return Host(0, announcement, math.inf, owner=key.encode())


def measured(hosts: list[Host], loss: float, weights: str) -> Measured:
    """The candidate `hosts` announce, measured at `loss` on both splits."""
    losses = Losses({"validation": loss, "train": loss})
    candidate = Candidate(hosts[0].announcement.checkpoint, tuple(hosts), plausible=True)
    return Measured(candidate, b"", hosts[0], losses.score, losses, weights)


# ---- keys the ledger credits are measured first -------------------------------------------------


@functools.cache
def rsa(name: str) -> RSAPrivateKey:
    return RSAPrivateKey()


def attestation(attester: str, **subjects: str) -> tuple[bytes, Attestation]:
    """`attester`'s signed word that it saw each subject (name -> key fingerprint) up for ten minutes."""
    rows = [Contribution(subject=fingerprint, peer_id=name, uptime_s=600) for name, fingerprint in subjects.items()]
    subkey = RSASignatureValidator(rsa(attester)).local_public_key
    return subkey, sign(rsa(attester), HOSTS_SWARM, f"peer-{attester}", rows, int(time.time()))


class LedgerOnTheDHT:
    """What `backed_keys` reads of a `SwarmDirectory`: its swarm, its terms, the attestations stored
    (or, where the DHT does not `answer`, DHTUnavailable)."""

    def __init__(self, *found: tuple[bytes, Attestation], answers: bool = True):
        self.swarm, self.membership = HOSTS_SWARM, Membership(HOSTS_SWARM)
        self.found, self.answers = dict(found), answers

    def attestations(self) -> dict[bytes, Attestation]:
        if not self.answers:
            raise DHTUnavailable(f"reading {HOSTS_SWARM}.ledger on the DHT failed (TimeoutError)")
        return self.found


def test_a_key_is_backed_once_two_other_keys_attest_its_work():
    honest, lone = voice("honest"), voice("lone")
    ledger = LedgerOnTheDHT(attestation("w1", honest=honest, lone=lone), attestation("w2", honest=honest))
    assert backed_keys(ledger) == {honest}  # one attester is one key's word: `lone` is not backed
    assert backed_keys(LedgerOnTheDHT(*ledger.found.items(), answers=False)) == frozenset()  # unread: nobody


def test_a_flood_of_free_keys_cannot_keep_a_host_the_ledger_credits_unmeasured(start, tiny_config, tiny_windows):
    """More fresh keys than a choice measures (`MEASURED_AT_MOST`) each announce another checkpoint
    a save or more ahead of a lone honest host, whose key two other keys attest. Ranked by step,
    the honest checkpoint is past the bound, and the flood is all that is measured; keys the ledger
    credits are measured first, so it is measured and chosen."""
    trainer = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=60, warmup_steps=5))
    train(trainer, 60)
    honest, stranger = start("honest"), start("stranger")
    good = honest.put(encode_block(trainer.module, tiny_config, 0, 10, HOSTS_SWARM), 10)
    flood = [host(f"sybil{i}", 11 + i, f"{i:064x}", peer_id=stranger.peer_id) for i in range(MEASURED_AT_MOST + 8)]
    hosts = [*flood, honest.host(good)]
    assert rank(hosts, tiny_config)[-1].checkpoint == good  # unbacked, it would be past the bound
    credited = owner_fingerprint(honest.directory.owner_subkey)
    backed = backed_keys(LedgerOnTheDHT(attestation("w1", honest=credited), attestation("w2", honest=credited)))
    with client_of(honest, stranger) as client:
        choice = client.run(choose_checkpoint(client.p2p, hosts, tiny_config, 0, SpotCheck(tiny_windows.fixed(64),
                                                                                              seed=1),
                                              backed=backed), 120)  # fmt: skip
    assert choice.checkpoint == good, [m.candidate.checkpoint.step for m in choice.measured]


# ---- a checkpoint taken from one key is that key's voice ----------------------------------------


def test_a_stranger_s_block_a_joiner_took_from_it_alone_gains_no_voucher():
    """Where keys count, vouchers decide among checkpoints within the noise of the best. A stranger's
    copy a save ahead, a little worse, is served by the stranger and by an honest joiner that
    adopted it from the stranger alone: one voice, like the lone honest host, so the lower loss
    wins. A joiner that took it from two voices is a voucher of its own."""
    stranger, honest = host("stranger", 11, BAD), host("honest", 10, GOOD)
    took_from_one = host("joiner", 11, BAD, taken_from=(voice("stranger"),))
    took_from_two = host("joiner", 11, BAD, taken_from=(voice("stranger"), voice("other")))
    chosen = lambda joiner: by_evidence([measured([stranger, joiner], 2.02, "bad"), measured([honest], 2.0, "good")],
                                        keys_count=True)[0].stamp.candidate.checkpoint.sha256  # fmt: skip
    assert chosen(took_from_one) == GOOD
    assert chosen(took_from_two) == BAD  # the scenario is one where a second voucher wins


def test_a_checkpoint_a_joiner_took_from_one_key_alone_is_not_agreed_on_without_a_measurement():
    """A generation client uses a checkpoint unmeasured where keys count and two voices serve it: a
    stranger and the joiner that adopted its block are one."""
    checks = Vetting(None, None, ModelConfig())  # deciding asks no peer
    stranger, joiner = host("stranger", 11, BAD), host("joiner", 11, BAD, taken_from=(voice("stranger"),))
    candidate = rank([stranger, joiner], ModelConfig())[0]
    assert not checks.usable(candidate, [stranger, joiner], keys_count=True)
    assert checks.usable(candidate, [stranger, host("other", 11, BAD)], keys_count=True)


def test_lineage_names_the_voices_it_was_taken_from_through_every_adoption():
    """A second joiner that takes the stranger's block from the stranger and the first joiner took it
    from one voice, and announces so; one key's records cannot name two sources to count twice."""
    first_joiner = host("joiner1", 11, BAD, taken_from=(voice("stranger"),))
    second = Choice(b"", first_joiner.announcement.checkpoint, 2.0, None, vouched_by=[host("stranger", 11, BAD),
                                                                                     first_joiner])  # fmt: skip
    assert second.taken_from == (voice("stranger"),)
    records = [host("k", 11, BAD, (voice("x"),), peer_id="p1"), host("k", 11, BAD, (voice("y"),), peer_id="p2")]
    assert vouchers_among(records) == 1


def test_a_record_whose_lineage_is_not_fingerprints_or_too_long_is_refused():
    record = host("joiner", 11, BAD).announcement.model_dump()
    for taken_from in (["not a fingerprint"], [voice(str(i)) for i in range(MAX_TAKEN_FROM + 1)]):
        assert parse_record(BlockAnnouncement, {**record, "taken_from": taken_from}) is None
    assert parse_record(BlockAnnouncement, {**record, "taken_from": [voice("stranger")]}) is not None


def test_a_peer_restarted_from_a_checkpoint_it_adopted_announces_its_lineage_again(tmp_path, tiny_config, tiny_windows):
    """Laundering across a restart: a joiner that adopted a block from one key keeps that lineage
    beside the checkpoint (`CheckpointStore.keep_lineage`), so that, restarted from it as its own
    newest, it announces the same lineage instead of those weights as its own. Once it has saved
    weights of its own, the old lineage names nothing it serves."""
    store = CheckpointStore(tmp_path, tiny_config, 0, HOSTS_SWARM)
    trainer = block_trainer(tiny_config, 0, tiny_windows, TrainConfig())
    adopted = store.save(trainer.module, 10)
    stranger = "ab" * 16
    store.keep_lineage(adopted, (stranger,))
    restarted = Served()  # what the restarted peer serves: nothing yet; nothing of the network is needed
    data = store.path_for(10).read_bytes()
    own = Choice(data, adopted, 1.0, chosen=None)  # its own newest won: no host
    start_from(own, tiny_config, SimpleNamespace(trainer=trainer, store=store), restarted)
    assert restarted.lineage == (adopted, (stranger,))
    trained = store.save(trainer.module, 11)
    assert store.lineage_of(trained) is None


def test_a_lineage_file_that_is_not_one_the_store_wrote_names_nobody(tmp_path, tiny_config, tiny_windows):
    store = CheckpointStore(tmp_path, tiny_config, 0, HOSTS_SWARM)
    info = store.save(block_trainer(tiny_config, 0, tiny_windows, TrainConfig()).module, 3)
    path = tmp_path / "lineage_block_0.json"
    for written in ("{not json", '["a list"]', json.dumps({"sha256": info.sha256, "taken_from": ["Z" * 32]}),
                    json.dumps({"sha256": info.sha256, "taken_from": ["ab" * 16] * (MAX_TAKEN_FROM + 1)})):  # fmt: skip
        path.write_text(written)
        assert store.lineage_of(info) is None, written
    store.keep_lineage(info, ("cd" * 16,))
    assert store.lineage_of(info) == ("cd" * 16,)
