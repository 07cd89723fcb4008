"""The robust aggregate that brings drifted replicas back together (swarm/sync/reconcile.py)."""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from types import SimpleNamespace

import datasets
import pytest
import torch
from conftest import SAMPLE_TEXT
from swarm_helpers import HOSTS_SWARM, client_of

from swarm.checkpoints.spot_check import NOISE, SpotCheck, suspicion
from swarm.checkpoints.store import CheckpointStore
from swarm.model.data import Corpus, load_corpus
from swarm.model.evaluate import block_elbo_bits
from swarm.model.train import TrainConfig, block_trainer
from swarm.p2p.directory import Host
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo, owner_fingerprint
from swarm.peer.config import PeerConfig
from swarm.peer.sync_setup import RECONCILE_DEADLINE_S
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer
from swarm.sync.exchange import Exchange, Gathered, Round
from swarm.sync.lockstep import DeMoSync
from swarm.sync.reconcile import (
    NEWCOMER_GRACE_S,
    POLL_S,
    ReconcileRound,
    Voice,
    median_of,
    weigh,
    weighted_median,
)


def voice(name: str, keys: int, *values: float) -> Voice:
    return Voice(name, {"w": torch.tensor(values)}, keys)


def test_a_weighted_median_picks_the_value_where_half_the_weight_is_reached():
    stacked = torch.tensor([[1.0, 5.0], [3.0, 2.0], [2.0, 9.0]])
    assert torch.equal(weighted_median(stacked, torch.tensor([1.0, 1.0, 1.0])), torch.tensor([2.0, 5.0]))
    assert torch.equal(weighted_median(stacked, torch.tensor([1.0, 3.0, 1.0])), torch.tensor([3.0, 2.0]))


def test_a_checkpoint_vouched_for_by_a_majority_of_keys_is_taken_bit_for_bit():
    honest = voice("aa", 2, 0.1, -0.2, 0.3)
    merged = median_of([honest, voice("ff", 1, 1e30, 1e30, -1e30)])
    assert torch.equal(merged["w"], honest.tensors["w"])


def test_a_liar_among_three_drifted_replicas_cannot_move_a_weight_outside_the_honest_range():
    honest = [voice("a1", 1, 0.1, 0.2), voice("a2", 1, 0.3, -0.1)]
    for lie in (1e30, -1e30, float(2**20)):
        merged = median_of([*honest, voice("zz", 1, lie, lie)])["w"]
        low = torch.minimum(honest[0].tensors["w"], honest[1].tensors["w"])
        high = torch.maximum(honest[0].tensors["w"], honest[1].tensors["w"])
        assert bool(((low <= merged) & (merged <= high)).all()), (lie, merged)


def test_the_median_of_two_voices_of_equal_weight_is_their_mean():
    """Of two checkpoints that pass in an open swarm (one voice each), the median was the lower of
    the two at every coordinate: each merge pulled every weight down."""
    merged = median_of([voice("aa", 1, 0.1, 4.0), voice("bb", 1, 0.3, -2.0)], keys_count=False)["w"]
    assert torch.allclose(merged, torch.tensor([0.2, 1.0]))


def test_in_an_open_swarm_the_keys_behind_a_checkpoint_add_no_weight():
    """Free keys are no evidence: two of them behind one checkpoint make it one voice beside this replica's
    own, not a majority taken bit for bit (where keys count, they are)."""
    own, theirs = voice("aa", 1, 0.1, 0.5), voice("bb", 2, 0.3, 0.2)
    assert torch.equal(median_of([own, theirs], keys_count=True)["w"], theirs.tensors["w"])
    merged = median_of([own, theirs], keys_count=False)["w"]
    assert not torch.equal(merged, theirs.tensors["w"])
    low = torch.minimum(own.tensors["w"], theirs.tensors["w"])
    high = torch.maximum(own.tensors["w"], theirs.tensors["w"])
    assert bool(((low <= merged) & (merged <= high)).all()), merged


def test_every_replica_that_reads_the_same_checkpoints_computes_the_same_median():
    voices = [voice("c", 1, 0.5, 0.1), voice("a", 1, 0.2, 0.4), voice("b", 1, 0.3, -0.3)]
    assert torch.equal(median_of(voices)["w"], median_of(voices[::-1])["w"])


def replica(key: str, sha: str, taken_from: tuple[str, ...] = ()) -> Host:
    """A replica under key `key` announcing the checkpoint `sha` of step 100, taken from `taken_from`."""
    info = CheckpointInfo(step=100, sha256=sha, size=1000, chunks=sha)
    record = BlockAnnouncement(peer_id=key, state="training", step=100, checkpoint=info, taken_from=taken_from)
    return Host(0, record, math.inf, owner=key.encode())


def test_a_replica_that_took_a_strangers_checkpoint_adds_no_voice_to_the_strangers_word():
    """Issue 46: this replica and one honest key hold the honest checkpoint; a stranger and an honest key
    that took the stranger's checkpoint from it alone hold the stranger's. Counted by keys that is 2
    against 2, no majority, and the median moves weights off the honest ones; counted by voices it is
    2 against 1, and the honest checkpoint is the median bit for bit."""
    own, honest = replica("own", "a" * 64), replica("honest", "a" * 64)
    stranger = replica("stranger", "b" * 64)
    launderer = replica("launderer", "b" * 64, taken_from=(owner_fingerprint(b"stranger"),))
    weights = weigh(own, {honest.announcement.checkpoint: [honest],
                          stranger.announcement.checkpoint: [stranger, launderer]})  # fmt: skip
    tensors = {"a" * 64: {"w": torch.tensor([0.1, -0.2, 0.3])}, "b" * 64: {"w": torch.tensor([-9.0, 9.0, -9.0])}}
    merged = median_of([Voice(c.sha256, tensors[c.sha256], n) for c, n in weights.items()])
    assert torch.equal(merged["w"], tensors["a" * 64]["w"]), weights


def test_a_replica_that_took_this_replicas_checkpoint_is_this_replicas_voice():
    """A replica's own record and the hosts that agree with it are one group: a host that took its
    checkpoint from this replica's key is not a second voice beside it."""
    own = replica("own", "a" * 64)
    taker = replica("taker", "a" * 64, taken_from=(owner_fingerprint(b"own"),))
    assert weigh(own, {own.announcement.checkpoint: [taker]}) == {own.announcement.checkpoint: 1}


def test_a_stopping_peer_ends_its_merge_round_at_once_with_its_weights_kept():
    """A round waits up to half its deadline for the others' checkpoints of its step; a stop
    signal must not wait with it (tests/test_chaos.py saw a peer held past its supervisor's 15 s
    by a round waiting for a killed replica's checkpoint). Told to stop, the round reads the
    records once, merges nothing and keeps the weights."""
    own = replica("own", "a" * 64)
    reads = []

    def hosts() -> list[Host]:  # only this replica's own record: the others never announce this step
        reads.append(own)
        return [own]

    stop = threading.Event()
    stop.set()
    merge = ReconcileRound(None, None, None, 0, b"own", hosts, deadline=10.0, spot_check=None, keys_count=lambda: False,
                           stop=stop)  # fmt: skip
    module = torch.nn.Linear(2, 2)
    before = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    assert merge.run(module, own.announcement, replicas=2) is None
    assert len(reads) == 1
    assert all(torch.equal(before[name], tensor) for name, tensor in module.state_dict().items())


def test_a_replica_that_took_no_part_in_a_round_is_not_waited_for_in_full_again():
    """Issue 57, B12: a key listed as a replica that never announces the round's step (a stranger's,
    free) held every round for half its deadline. The first round waits for it in full; the next
    one waits only `NEWCOMER_GRACE_S` for it."""
    own = replica("own", "a" * 64)
    silent = Host(0, BlockAnnouncement(peer_id="silent", state="training", step=100), math.inf, owner=b"silent")
    merge = ReconcileRound(None, None, None, 0, b"own", lambda: [own, silent], deadline=16.0, spot_check=None,
                           keys_count=lambda: False)  # fmt: skip
    module = torch.nn.Linear(2, 2)
    waits = []
    for _ in range(2):
        started = time.monotonic()
        assert merge.run(module, own.announcement, replicas=1) is None  # nobody else spoke: weights kept
        waits.append(time.monotonic() - started)
    assert waits[0] >= 16.0 / 2 - POLL_S - 0.5, waits
    assert waits[1] <= NEWCOMER_GRACE_S + 2 * POLL_S, waits


@pytest.mark.parametrize("voted", [False, True])
def test_a_first_round_waits_in_full_only_for_replicas_whose_payloads_made_the_last_update(voted):
    """Issue 57: free keys whose records name them replicas of the block, and that never send a
    payload this replica applies nor announce a checkpoint, held a lone replica's first round for half
    its deadline (30 s at the peer's defaults: the jump rows of benchmarks/attacks.py, 22x the lone
    replica's seconds a step). A record is anyone's claim; a payload that made the last update is
    evidence of a replica training beside this one. Only such a replica is waited for in full."""
    own = replica("own", "a" * 64)
    silent = Host(0, BlockAnnouncement(peer_id="silent", state="training", step=100), math.inf, owner=b"silent")
    voters = frozenset({"silent"} if voted else set())
    merge = ReconcileRound(None, None, None, 0, b"own", lambda: [own, silent], deadline=16.0, spot_check=None,
                           keys_count=lambda: False, voters=lambda: voters)  # fmt: skip
    started = time.monotonic()
    assert merge.run(torch.nn.Linear(2, 2), own.announcement, replicas=1) is None  # nobody else spoke: weights kept
    waited = time.monotonic() - started
    if voted:
        assert waited >= 16.0 / 2 - POLL_S - 0.5, waited
    else:
        assert waited <= NEWCOMER_GRACE_S + 2 * POLL_S, waited


def test_in_an_open_swarm_a_strangers_made_up_fingerprint_alone_does_not_decide_whether_a_merge_runs():
    """Issue 57, A7: one well-formed payload under a made-up fingerprint told a replica that the
    replicas drifted, and so forced a merge round at the next scheduled step. In an open swarm a
    round is due at every scheduled step whatever anyone's fingerprint says; where keys count, a
    member's fingerprint still decides."""
    optimizer = DeMoOptimizer(torch.nn.Linear(2, 2), DeMoConfig(), lr=2e-3)
    exchange = Exchange(transport=SimpleNamespace(judged=lambda *_: None), own_id="me", replica_ids=list)
    sync = DeMoSync(optimizer, exchange)
    open_swarm = ReconcileRound(None, None, None, 0, b"own", list, 60.0, spot_check=None, keys_count=lambda: False)
    members = ReconcileRound(None, None, None, 0, b"own", list, 60.0, spot_check=None, keys_count=lambda: True)
    before = open_swarm.due(sync.may_have_drifted), members.due(sync.may_have_drifted)
    round_ = Round(step=5, own=b"mine", fingerprint=b"same", gathering=None)
    gathered = Gathered(asked=1, payloads={"stranger": b"fits"}, fingerprints={"stranger": b"made up!"})
    exchange.in_order(round_, gathered, lambda data: data)  # accepted: it decodes
    after = open_swarm.due(sync.may_have_drifted), members.due(sync.may_have_drifted)
    assert before[0] == after[0]  # the open swarm's rounds: the stranger's fingerprint changed nothing
    assert before[1] != after[1]  # where keys count, the fingerprint (a member's) is what decides


def lowered(block: torch.nn.Module) -> torch.nn.Module:
    """A copy of `block` with every weight lowered by twice its tensor's RMS and more: the median
    of the two moves every weight of the block down by its tensor's RMS or more."""
    copied = copy.deepcopy(block)
    with torch.no_grad():
        for param in copied.parameters():
            param.sub_(2 * param.pow(2).mean().sqrt() + 0.1)
    return copied


def test_two_free_keys_announcing_a_poisoned_checkpoint_at_the_merge_step_leave_a_lone_replica_as_it_was(
    start, tiny_config, text_file, tmp_path, caplog
):
    """Issue 57, A6: one honest replica, and two free keys on 127.0.0.1 that announce one checkpoint
    stamped at the merge step: the replica's own weights, each lowered (`lowered`), so that without
    the spot check the median of own and theirs is half poison (counted by keys, two against one,
    it was the poison bit for bit). At the peer's defaults (its deadline, a spot check on private windows
    of its text, an open swarm), the poison measures far worse than the replica's own weights and
    takes no part: the replica's loss on held-out windows stays within 1.05x of its own."""
    step = PeerConfig().average_every
    corpus = load_corpus(str(text_file))
    trainer = block_trainer(tiny_config, 0, corpus.windows("train", tiny_config), TrainConfig(batch_size=16, seed=3))
    for _ in range(40):
        trainer.step()
    honest, held_out = trainer.module, corpus.windows("validation", tiny_config).fixed(64, seed=5)
    before = block_elbo_bits(honest, tiny_config, 0, held_out)
    poison = lowered(honest)
    keys = [start(f"key{i}") for i in range(2)]
    infos = [key.store.save(poison, step) for key in keys]
    assert infos[0] == infos[1]  # one checkpoint, two free keys behind it
    own_info = CheckpointStore(tmp_path / "own", tiny_config, 0, HOSTS_SWARM).save(honest, step)
    own = BlockAnnouncement(peer_id="honest", state="training", step=step, checkpoint=own_info)
    caplog.set_level(logging.INFO, logger="swarm.sync.reconcile")
    with client_of(*keys) as client:
        spot_check = SpotCheck.from_corpus(corpus, tiny_config)
        merge = ReconcileRound(client.p2p, client.loop, tiny_config, 0, b"honest key",
                               lambda: [key.host(info) for key, info in zip(keys, infos)], RECONCILE_DEADLINE_S,
                               spot_check, lambda: client.directory.keys_count)  # fmt: skip
        assert not client.directory.keys_count  # an open swarm, as at the defaults
        merge.run(honest, own, replicas=2)
    assert spot_check.measured == 2, caplog.text  # the poison and the replica's own weights were measured
    after = block_elbo_bits(honest, tiny_config, 0, held_out)
    assert after <= 1.05 * before, (before, after, caplog.text)
    assert not all(torch.equal(p, q) for p, q in zip(honest.parameters(), poison.parameters()))
    assert "takes no part in the merge" in caplog.text


def trained_then_on(config, corpus, first: int, then: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Block 0 trained `first` steps on the training text (a copy), and the same trained `then` more."""
    trainer = block_trainer(config, 0, corpus.windows("train", config), TrainConfig(batch_size=16, seed=3))
    for _ in range(first):
        trainer.step()
    early = copy.deepcopy(trainer.module)
    for _ in range(then):
        trainer.step()
    return early, trainer.module


def test_a_replica_whose_own_weights_measure_worse_than_two_others_takes_their_checkpoint(
    start, tiny_config, text_file, tmp_path
):
    """A laptop that dozed and trained alone: its weights trained 10 steps, the others' 60 (one
    checkpoint, two hosts on 127.0.0.1). At the peer's defaults its own weights measure worse than
    theirs by more than `NOISE` on its private windows, so they take no part in the median, and it
    takes the others' weights bit for bit. Before, its own always took part: the median of its
    weights and theirs left it apart from them, round after round (tests/test_sync.py's dozing
    replica)."""
    step = PeerConfig().average_every
    corpus = load_corpus(str(text_file))
    dozed, ahead = trained_then_on(tiny_config, corpus, 10, 50)
    keys = [start(f"key{i}") for i in range(2)]
    infos = [key.store.save(ahead, step) for key in keys]
    own_info = CheckpointStore(tmp_path / "own", tiny_config, 0, HOSTS_SWARM).save(dozed, step)
    own = BlockAnnouncement(peer_id="dozed", state="training", step=step, checkpoint=own_info)
    with client_of(*keys) as client:
        spot_check = SpotCheck.from_corpus(corpus, tiny_config)
        merge = ReconcileRound(client.p2p, client.loop, tiny_config, 0, b"dozed key",
                               lambda: [key.host(info) for key, info in zip(keys, infos)], RECONCILE_DEADLINE_S,
                               spot_check, lambda: client.directory.keys_count)  # fmt: skip
        assert merge.run(dozed, own, replicas=2) is True
    assert all(torch.equal(p, q) for p, q in zip(dozed.parameters(), ahead.parameters()))


def documents(text: str) -> datasets.Dataset:
    """`text` as documents of 300 characters, as `text_file` holds them."""
    return datasets.Dataset.from_dict({"text": [text[i : i + 300] for i in range(0, len(text), 300)]})


def test_a_checkpoint_that_has_seen_the_held_out_text_neither_sets_the_merges_bar_nor_takes_part(
    start, tiny_config, tmp_path, caplog
):
    """A lone replica (10 steps on the training text), and two free keys on 127.0.0.1 announcing one
    checkpoint trained 100 steps on the training text, then fine-tuned on the held-out text until it
    scores much better there than on the training text (`spot_check.suspicion`). Its spot-check score
    (the worse of its sources) is still far better than the replica's own, so if it set the round's
    bar, the replica's own weights would measure more than `NOISE` above it, take no part, and the
    replica would take the keys' checkpoint bit for bit. It is suspicious, so it neither sets the bar
    nor takes part: the replica keeps its weights."""
    step = PeerConfig().average_every
    corpus = Corpus(documents(SAMPLE_TEXT), documents("0123456789 " * 200))
    own_weights, further = trained_then_on(tiny_config, corpus, 10, 90)
    tuned = block_trainer(tiny_config, 0, corpus.windows("validation", tiny_config), TrainConfig(batch_size=16, seed=5))
    tuned.module.load_state_dict(further.state_dict())
    for _ in range(35):
        tuned.step()
    spot_check = SpotCheck.from_corpus(corpus, tiny_config)
    seen = spot_check.losses(tuned.module, tiny_config, 0)
    assert suspicion(seen) and seen.score + NOISE < spot_check.measure(own_weights, tiny_config, 0)  # the scenario
    keys = [start(f"key{i}") for i in range(2)]
    infos = [key.store.save(tuned.module, step) for key in keys]
    own_info = CheckpointStore(tmp_path / "own", tiny_config, 0, HOSTS_SWARM).save(own_weights, step)
    own = BlockAnnouncement(peer_id="lone", state="training", step=step, checkpoint=own_info)
    before = copy.deepcopy(own_weights)
    caplog.set_level(logging.INFO, logger="swarm.sync.reconcile")
    with client_of(*keys) as client:
        merge = ReconcileRound(client.p2p, client.loop, tiny_config, 0, b"lone key",
                               lambda: [key.host(info) for key, info in zip(keys, infos)], RECONCILE_DEADLINE_S,
                               spot_check, lambda: client.directory.keys_count)  # fmt: skip
        assert merge.run(own_weights, own, replicas=2) is None, caplog.text  # only its own voice is left
    assert all(torch.equal(p, q) for p, q in zip(own_weights.parameters(), before.parameters()))
    assert "better on held-out text" in caplog.text
