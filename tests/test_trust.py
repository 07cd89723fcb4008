"""Lying peers in a real swarm: none of them takes over a block, the model record, or generation.

One tiny swarm: peer a hosts block 0; b1 and b2 host block 1 with the same checkpoint (b2
starts from b1's). Each test adds a liar (see swarm.lab.attacks) and checks what honest
fetches, joiners and generation clients end up with.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import random
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from hivemind.utils import get_dht_time
from swarm_helpers import FAST_PEER, tiny_swarm, wait_for

from swarm.checkpoints.assemble import choose_block
from swarm.checkpoints.choice import STEP_LEAD, Candidate, Measured, SpotCheck, believable, rank, uniform_ce
from swarm.checkpoints.download import download_verified
from swarm.checkpoints.store import CheckpointStore
from swarm.checkpoints.transfer import FIRST_BYTE_TIMEOUT_S, ask_chunk_list
from swarm.errors import SwarmError
from swarm.lab.attacks import (
    STEP_LIE,
    HonestThenWrong,
    HostileNode,
    TricklingDownloads,
    WrongAnswers,
    checkpoint_of,
    degraded_block,
    garbage_block,
    plant_checkpoint,
    sybil_nodes,
)
from swarm.model.checkpoint import load_model_folder
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.families import local_runner
from swarm.model.generate import continue_text
from swarm.model.train import TrainConfig, block_trainer, train
from swarm.p2p.directory import Host
from swarm.p2p.info import InfoServicer
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo, ModelRecord, model_key, owner_fingerprint
from swarm.serving import vetting
from swarm.serving.audit import LoneKeyAudit
from swarm.serving.cross_check import CONTRADICTED, Ban, majority, one_voice
from swarm.serving.remote import RemoteBlocks

SWARM = "trusttest"


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with tiny_swarm(tmp_path_factory.mktemp("trust"), SWARM, {"a": "0", "b1": "1"}) as (local, peers, client):
        peers["b2"] = local.start_peer("b2", "1", FAST_PEER)
        wait_for(lambda: len(serving(client, 1)) == 2, 60, "b2 serving b1's checkpoint")
        fetched = local.run("swarm-fetch", "--out", "honest", "--data", local.data)
        assert fetched.returncode == 0, fetched.stderr
        yield local, client, load_model_folder(local.workdir / "honest")


def serving(client, block: int) -> list:
    return [h for h in client.directory.hosts(block) if h.announcement.state == "serving"]


def honest_checkpoint(client) -> CheckpointInfo:
    checkpoints = {h.announcement.checkpoint for h in serving(client, 1) if h.announcement.public_name in ("b1", "b2")}
    assert len(checkpoints) == 1, checkpoints  # b2 started from b1's checkpoint: they vouch for one
    return checkpoints.pop()


def fetch_manifest(local, out: str) -> tuple[dict, str]:
    result = local.run("swarm-fetch", "--out", out, "--data", local.data, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((local.workdir / out / "manifest.json").read_text()), result.stderr


def test_a_step_liar_with_a_garbage_block_is_not_fetched_joined_or_served(swarm):
    local, client, _ = swarm
    config, honest = client.directory.read_model(), honest_checkpoint(client)
    plant_checkpoint(local.workdir / "liar", garbage_block(config, 1), config, 1, STEP_LIE, SWARM)
    liar = local.start_peer("liar", "1", ["--max-steps", "1", "--announce-period", "1"])
    wait_for(lambda: [h for h in serving(client, 1) if h.announcement.step == STEP_LIE], 60, "the liar announcing")
    try:
        manifest, log = fetch_manifest(local, "after-step-lie")
        assert manifest["blocks"]["1"]["sha256"] == honest.sha256, manifest
        assert "rejected the step 999999 checkpoint" in log, log[-3000:]  # measured, and found out

        joiner = local.start_peer("c", "1", FAST_PEER)
        c = wait_for(lambda: [h for h in client.directory.hosts(1) if h.announcement.public_name == "c"
                              and h.announcement.state != "joining"], 60, "the joiner")[0]  # fmt: skip
        assert c.announcement.checkpoint == honest, c.announcement
        local.stop(joiner)

        runner = RemoteBlocks(client.directory, client.p2p, client.loop, config, request_timeout=10)
        assert runner.choose(1).announcement.public_name in ("b1", "b2")
    finally:
        local.stop(liar)


def test_an_oversized_trickling_announcement_is_never_downloaded(swarm):
    local, client, _ = swarm
    honest = honest_checkpoint(client)
    trickler = TricklingDownloads(1)
    with HostileNode(SWARM, local.initial_peers) as node:
        node.serve(InfoServicer(lambda: node.info(1)), trickler)
        huge = CheckpointInfo(step=honest.step + 1, sha256="ab" * 32, size=2**33, chunks="ab" * 32)  # newer, and heavy
        node.announce(1, **checkpoint_of(huge))
        manifest, _ = fetch_manifest(local, "after-trickle")
    assert manifest["blocks"]["1"]["sha256"] == honest.sha256
    assert trickler.asked == 0  # never tried: no block of the model weighs 8 GiB


def test_a_hijacked_model_record_is_ignored_by_whoever_holds_the_join_line(swarm):
    local, client, _ = swarm
    real = client.directory.read_model()
    other = ModelConfig(**{**real.to_dict(), "n_blocks": 1, "n_layers": 2})
    with HostileNode(SWARM, local.initial_peers) as node:
        assert node.directory.publish_model(other, lifetime_s=600)  # under its own key: the DHT takes it
        unowned = ModelRecord(config=other.to_dict(), config_hash=other.hash()).model_dump()
        assert not node.dht.store(model_key(SWARM), unowned, get_dht_time() + 600)  # without one: refused
        status = local.run("swarm-status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["config_hash"] == real.hash()
        assert "competing model record" in status.stderr
        assert client.directory.read_model() == real


def test_a_replica_answering_wrongly_beside_two_honest_keys_is_shown_wrong_here_and_banned_for_good(swarm):
    """In this open swarm no count of keys decides (issue 57): b1 and b2 contradict the liar, the
    client computes the answer itself, and the liar is banned for good, not merely outvoted."""
    local, client, model = swarm
    honest = honest_checkpoint(client)
    config = model.config
    with HostileNode(SWARM, local.initial_peers) as node:
        node.serve(InfoServicer(lambda: node.info(1)), WrongAnswers(config, 1, honest.sha256))
        node.announce(1, state="serving", **checkpoint_of(honest))  # vouches for the honest checkpoint
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(1)}, 30, "the liar's record")
        runner = generation_client(local, client, config)
        liar = next(h for h in client.directory.hosts(1) if h.peer_id == node.peer_id)
        runner.replicas.rtt[liar.peer_id, liar.owner] = 0.0  # the harness: the liar is the one that answers fastest
        text = b"".join(continue_text(runner, config, b"The quick brown", 24, steps_per_block=2, seed=3))
    assert text == honest_text(model, b"The quick brown", 24, seed=3)
    assert runner.checks.banned == 1 and runner.checks.disagreements == 1, runner.checks
    assert runner.choose(1).peer_id != node.peer_id
    assert runner.replicas.banned_until[liar.peer_id] == math.inf  # shown wrong by the client's own computation


def generation_client(local, client, config: ModelConfig) -> RemoteBlocks:
    """A generation client that measures checkpoints on the swarm's own text; the liars' answers, the
    test harness says, come fastest."""
    spot_check = SpotCheck.from_source(local.data, config)
    return RemoteBlocks(client.directory, client.p2p, client.loop, config, request_timeout=10, spot_check=spot_check)


def honest_of(client, block: int) -> CheckpointInfo:
    """The checkpoint that block `block`'s honest hosts (a; b1 and b2) serve."""
    if block == 1:
        return honest_checkpoint(client)
    return next(h.announcement.checkpoint for h in serving(client, 0) if h.announcement.public_name == "a")


def honest_text(model, prompt: bytes, length: int, seed: int) -> bytes:
    runner = local_runner(model.denoiser_for_block, model.config)
    return b"".join(continue_text(runner, model.config, prompt, length, steps_per_block=2, seed=seed))


def test_a_stranger_one_save_ahead_of_a_lone_honest_host_is_measured_before_it_is_used(swarm, tmp_path):
    """Issue 26, item 6: block 0 has one honest host, a; a stranger under one key announces a
    checkpoint one step ahead, serves it (garbage) for download and answers requests wrongly."""
    local, client, model = swarm
    config, honest = model.config, honest_of(client, 0)
    with HostileNode(SWARM, local.initial_peers) as node:
        store = CheckpointStore(tmp_path, config, 0, SWARM)
        ahead = store.save(garbage_block(config, 0), honest.step + 1)
        node.serve_checkpoint(store, ahead, WrongAnswers(config, 0, ahead.sha256))
        announced = lambda: ahead in {h.announcement.checkpoint for h in client.directory.hosts(0)}
        wait_for(announced, 30, "the stranger's record")
        runner = generation_client(local, client, config)
        text = b"".join(continue_text(runner, config, b"The quick brown", 24, steps_per_block=2, seed=5))
    assert text == honest_text(model, b"The quick brown", 24, seed=5)
    assert runner.vetting.failed[ahead] == math.inf and honest in runner.vetting.passed  # a bad file stays bad
    assert runner.checks.checkpoints_measured == 3, runner.checks  # and block 1's: keys are free in this swarm


def test_sybil_keys_serving_a_degraded_block_beside_a_lone_honest_host_are_measured_not_counted(swarm, tmp_path):
    """Issue 27, the Sybil row of benchmarks/attacks.py in small, in this open swarm at the defaults:
    strangers serve a copy of lone host a's block 0 made worse (`degraded_block`: finite, better than
    a uniform guess), for download and for denoising. Three keys vouch for it stamped a step ahead of
    a's, and one key each for it stamped two and three steps ahead, so that the three best-ranked
    checkpoints are the Sybils' and fill a round of `Vetting.measure`: measured alone, they would
    pass. Keys cost nothing here, so the client counts none: it measures every checkpoint first. So
    does swarm-fetch's choice of the block (`choose_block`): three candidates measured, as where
    keys count, would be the Sybils' three."""
    local, client, model = swarm
    config, honest = model.config, honest_of(client, 0)
    runner = generation_client(local, client, config)
    loss = lambda denoiser: runner.spot_check.measure(denoiser, config, 0)
    worse_by = 3 * runner.spot_check.tolerance  # beyond the tolerance, short of a uniform guess for a block this young
    poison = degraded_block(model.denoiser_for_block(0), loss, worse_by)
    store = CheckpointStore(tmp_path, config, 0, SWARM, keep=3)
    vouched, *ahead = sybils = [store.save(poison, honest.step + saves) for saves in (1, 2, 3)]
    alone = Measured(Candidate(vouched, (), plausible=True), b"", record_of("sybil", vouched), loss(poison))
    # nothing about it alone gives it away
    assert believable([alone], runner.spot_check.tolerance, uniform_ce(runner.config)), alone
    assert alone.loss >= loss(model.denoiser_for_block(0)) + worse_by, alone
    with contextlib.ExitStack() as stack:
        for info, keys in [(vouched, 3), *((info, 1) for info in ahead)]:
            stack.enter_context(sybil_nodes(SWARM, local.initial_peers, store, info, poison, config, keys))
        served = lambda: [h.announcement.checkpoint for h in client.directory.hosts(0)]
        wait_for(lambda: sorted(map(served().count, sybils)) == [1, 1, 3], 30, "the Sybils' records")
        ranked = [c.checkpoint for c in rank(client.directory.hosts(0), config) if c.checkpoint in (*sybils, honest)]
        assert ranked == [vouched, *ahead[::-1], honest], ranked  # the Sybils' three rank first
        text = b"".join(continue_text(runner, config, b"Swarms of", 40, steps_per_block=2, seed=8))
        fetched = choose_block(client, config, 0, runner.spot_check)
    assert fetched.checkpoint == honest, fetched.measured  # a fetch takes a's checkpoint too
    assert {*sybils, honest} <= {m.candidate.checkpoint for m in fetched.measured}, fetched.measured
    assert runner.used[0] == {honest.sha256}, runner.used  # every answer of block 0 came from a's checkpoint
    assert all(runner.vetting.failed[info] == math.inf for info in sybils), runner.vetting.failed  # measured, refused
    assert text == honest_text(model, b"Swarms of", 40, seed=8)


@pytest.mark.parametrize("block", [1, 0], ids=["beside two honest keys", "beside one honest key"])
def test_a_replica_that_answers_honestly_at_first_and_lies_afterwards_gets_no_lie_into_the_output(swarm, block):
    """Issue 26, item 7: the liar serves the honest checkpoint of `block` truly for its first two
    answers, then wrongly. Beside two honest keys or one, they contradict it, and the client computes
    the disputed answer itself from the checkpoint's file (an open swarm counts no keys: issue 57)."""
    local, client, model = swarm
    config, honest = model.config, honest_of(client, block)
    with HostileNode(SWARM, local.initial_peers) as node:
        liar = HonestThenWrong(config, block, model.denoiser_for_block(block), honest.sha256, honest=2)
        node.serve(InfoServicer(lambda: node.info(block)), liar)
        node.announce(block, state="serving", **checkpoint_of(honest))
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(block)}, 30, "the liar's record")
        runner = generation_client(local, client, config)
        host = next(h for h in client.directory.hosts(block) if h.peer_id == node.peer_id)
        runner.replicas.rtt[host.peer_id, host.owner] = 0.0  # the harness: the liar is the one that answers fastest
        text = b"".join(continue_text(runner, config, b"Swarms of", 40, steps_per_block=2, seed=6))
    assert liar.answered > liar.honest  # it did lie
    assert text == honest_text(model, b"Swarms of", 40, seed=6)
    settled_here = runner.checks.computed_here - runner.checks.lone_checked  # every voice's answers are audited too
    assert runner.checks.banned == 1 and settled_here == 1, runner.checks
    assert runner.choose(block).peer_id != node.peer_id


@contextmanager
def a_liar_beside_a(local, client, model, tmp_path, honest: int):
    """A stranger that serves lone host a's checkpoint of block 0, its true file for download and
    its true weights for its first `honest` answers, then other weights; yields (the liar, its
    host record, a's host record)."""
    config, info = model.config, honest_of(client, 0)
    a = next(h for h in serving(client, 0) if h.announcement.public_name == "a")
    downloaded, _ = client.loop.run(download_verified(client.p2p, [a], config, 0, show_progress=False), 60)
    store = CheckpointStore(tmp_path, config, 0, SWARM)
    store.adopt(downloaded.data, info)
    with HostileNode(SWARM, local.initial_peers) as node:
        liar = HonestThenWrong(config, 0, model.denoiser_for_block(0), info.sha256, honest=honest)
        node.serve_checkpoint(store, info, liar)
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(0)}, 30, "the liar's record")
        yield liar, next(h for h in client.directory.hosts(0) if h.peer_id == node.peer_id), a


@pytest.mark.parametrize("keys", [2, 4])
def test_free_keys_agreeing_on_wrong_answers_do_not_outvote_a_lone_honest_host(swarm, tmp_path, keys):
    """Issue 57, "outvoting a lone host", in this open swarm at the client's defaults: `keys` free
    keys announce lone host a's checkpoint of block 0, serve its true file for download, and answer
    every request with one set of wrong weights, all alike; they answer fastest (the harness: a
    stranger picks its own speed). Counted as keys they were a strict majority: a was banned, their
    answers used and credited. Here every key of the checkpoint is asked at once, a contradicts
    them, the client computes the answer itself: the text is a's, they are banned for good, a is
    not, and only a is credited."""
    local, client, model = swarm
    config, info = model.config, honest_of(client, 0)
    a = next(h for h in serving(client, 0) if h.announcement.public_name == "a")
    downloaded, _ = client.loop.run(download_verified(client.p2p, [a], config, 0, show_progress=False), 60)
    store = CheckpointStore(tmp_path, config, 0, SWARM)
    store.adopt(downloaded.data, info)
    wrong = garbage_block(config, 0, scale=1.0)  # one set of weights for all: their answers agree
    with sybil_nodes(SWARM, local.initial_peers, store, info, wrong, config, keys) as nodes:
        liars = {node.peer_id for node in nodes}
        wait_for(lambda: liars <= {h.peer_id for h in client.directory.hosts(0)}, 30, "the free keys' records")
        runner = generation_client(local, client, config)
        runner.witness = client.witness()
        liar_hosts = [h for h in client.directory.hosts(0) if h.peer_id in liars]
        for host in liar_hosts:
            runner.replicas.rtt[host.peer_id, host.owner] = 0.0  # the harness: they answer fastest
        assert runner.choose(0).peer_id in liars
        text = b"".join(continue_text(runner, config, b"Swarms of", 40, steps_per_block=2, seed=11))
    assert text == honest_text(model, b"Swarms of", 40, seed=11)
    assert not runner.replicas.banned(a.peer_id), runner.replicas.banned_until
    assert all(runner.replicas.banned_until.get(p) == math.inf for p in liars), runner.replicas.banned_until
    assert runner.checks.disagreements == 1 and runner.checks.banned == keys, runner.checks  # all at once
    credited = {c.subject: c.answers for c in runner.witness.attestation().contributions}
    assert credited.get(owner_fingerprint(a.owner), 0) >= 1, credited  # its answer the client computed too
    assert not any(credited.get(owner_fingerprint(h.owner)) for h in liar_hosts), credited


def test_a_liar_gets_no_lie_through_when_its_only_fellow_replica_fails_once(swarm, tmp_path):
    """Review of issue 26, finding 1: a liar and lone honest host a serve a's checkpoint. a fails
    once (busy, which a stranger can cause) just as the client chooses, so the checkpoint looks
    one-key, is measured (the liar serves the true file) and is chosen. Once a's ban ends, a
    confirms every answer again: the liar's first lie is caught and settled here."""
    local, client, model = swarm
    with a_liar_beside_a(local, client, model, tmp_path, honest=2) as (liar, liar_host, a):
        runner = generation_client(local, client, model.config)
        runner.replicas.rtt[liar_host.peer_id, liar_host.owner] = 0.0  # the harness: the liar answers fastest
        runner.replicas.ban(a, "failed once (the harness)")
        assert runner.choose(0).peer_id == liar_host.peer_id
        runner.replicas.banned_until.pop(a.peer_id)  # the harness: a's ban runs out
        text = b"".join(continue_text(runner, model.config, b"Swarms of", 40, steps_per_block=2, seed=7))
    assert liar.answered > liar.honest  # it did lie
    assert text == honest_text(model, b"Swarms of", 40, seed=7)
    assert runner.checks.disagreements == 1, runner.checks  # a, its witness again, contradicted it
    held = [info for info, _ in runner.vetting._held.values()]
    assert held == [honest_of(client, 0), honest_of(client, 1)]  # one file a block (both measured: an open swarm)
    assert runner.replicas.banned_until[liar_host.peer_id] == math.inf  # shown wrong by the client's own computation


def test_a_liar_gets_no_lie_through_while_its_only_fellow_replica_is_banned(swarm, tmp_path):
    """Review of issue 26, finding 1: as above, but a stays banned. The checkpoint is measured
    and the liar is the only replica that answers; a still announces it, so the client does not
    take the liar's unconfirmed answer: it computes it here, and bans the liar for good."""
    local, client, model = swarm
    config = model.config
    with a_liar_beside_a(local, client, model, tmp_path, honest=0) as (liar, liar_host, a):
        runner = generation_client(local, client, config)
        runner.replicas.ban(a, "failed once (the harness)", 600)
        text = b"".join(continue_text(runner, config, b"Swarms of", config.gen_len, steps_per_block=2, seed=7))
    assert liar.answered == 1 and runner.checks.checkpoints_measured == 2, runner.checks  # a's, and block 1's
    assert text == honest_text(model, b"Swarms of", config.gen_len, seed=7)
    settled_here = runner.checks.computed_here - runner.checks.lone_checked  # block 1's answer may be audited
    assert settled_here == runner.checks.banned == 1, runner.checks
    assert runner.replicas.banned_until[liar_host.peer_id] == math.inf
    runner.replicas.ban(liar_host, "failed")  # a later, shorter ban does not end a ban for good
    assert runner.replicas.banned_until[liar_host.peer_id] == math.inf


def test_honest_weights_restamped_by_a_stranger_that_answers_wrongly_are_witnessed_by_their_honest_host(
    swarm, tmp_path
):
    """Issue 46: a stranger serves lone host a's block 0 weights bit for bit, stamped a few steps
    behind a's (the lower stamp is the one the client asks first), and answers requests wrongly.
    The two files differ (the step is in their metadata) but their weights do not: one checkpoint,
    so a's answers witness the stranger's, and the client's own computation settles it."""
    local, client, model = swarm
    config, honest = model.config, honest_of(client, 0)
    store = CheckpointStore(tmp_path, config, 0, SWARM)
    restamped = store.save(model.denoiser_for_block(0), honest.step - 3)
    with HostileNode(SWARM, local.initial_peers) as node:
        node.serve_checkpoint(store, restamped, WrongAnswers(config, 0, restamped.sha256))
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(0)}, 30, "the stranger's record")
        runner = generation_client(local, client, config)
        host = next(h for h in client.directory.hosts(0) if h.peer_id == node.peer_id)
        runner.replicas.rtt[host.peer_id, host.owner] = 0.0  # the harness: the stranger answers fastest
        text = b"".join(continue_text(runner, config, b"Swarms of", 40, steps_per_block=2, seed=9))
        node.leave(0)
    assert text == honest_text(model, b"Swarms of", 40, seed=9)
    # shown wrong by the client's own computation
    assert runner.replicas.banned_until[node.peer_id] == math.inf, runner.checks
    assert runner.checks.disagreements >= 1, runner.checks


def test_a_lone_key_lying_about_weights_of_its_own_is_caught_by_the_audit_and_banned(swarm, tmp_path):
    """Issue 46, lone keys' answers: a stranger serves block 0 weights of its own (a's, changed a
    little: they measure as well, and no other key serves them, so nobody can witness its answers)
    and answers every request with other weights. The client checks a share of a lone key's
    answers, drawn in private (seeded here: the third draw, for block 0's second answer, is the first
    under the rate; block 1's answers draw too), bans the stranger for good on the first lie it
    checks, and goes on with a's checkpoint."""
    local, client, model = swarm
    config, honest = model.config, honest_of(client, 0)
    own = nearby(model.denoiser_for_block(0))
    store = CheckpointStore(tmp_path, config, 0, SWARM)
    info = store.save(own, honest.step + 1)
    with HostileNode(SWARM, local.initial_peers) as node:
        liar = HonestThenWrong(config, 0, own, info.sha256, honest=0)
        node.serve_checkpoint(store, info, liar)
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(0)}, 30, "the stranger's record")
        runner = generation_client(local, client, config)
        runner.audit = LoneKeyAudit(draws=random.Random(2))  # draws 0.956 (block 0), 0.948 (block 1), 0.057 (block 0)
        a = next(h for h in serving(client, 0) if h.announcement.public_name == "a")
        runner.replicas.ban(a, "busy (the harness)", 600)  # so the stranger's checkpoint is the one chosen
        assert runner.choose(0).peer_id == node.peer_id
        runner.replicas.banned_until.pop(a.peer_id)
        b"".join(continue_text(runner, config, b"Swarms of", 5 * config.gen_len, steps_per_block=2, seed=8))
        node.leave(0)
    assert liar.answered == 2, runner.checks  # one lie used, the second checked: no third request
    assert runner.replicas.banned_until[node.peer_id] == math.inf, runner.checks
    assert runner.checks.lone_checked >= 1 and runner.checks.banned == 1, runner.checks
    assert runner.used[0] == {info.sha256, honest.sha256}  # a's checkpoint from then on


def nearby(block):
    """A copy of `block` changed a little: other weights that measure as well."""
    own = copy.deepcopy(block)
    noise = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in own.parameters():
            parameter.add_(1e-4 * torch.randn(parameter.shape, generator=noise))
    return own


def test_free_keys_lying_together_about_weights_of_their_own_are_audited_as_one_voice(swarm, tmp_path):
    """Issue 57, what keys that always agree can still do where no honest host serves their
    checkpoint: two free keys serve block 0 weights of their own (a's, changed a little: they measure
    as well) and answer every request with one set of other weights, so each witnesses the other.
    Their agreement is no evidence: what they agree on is audited as a lone key's is (seeded here:
    the third draw, for block 0's second answer, is the first under the rate; block 1's answers draw
    too), both are asked each time, so the first checked lie bans both at once, for good; neither is
    credited, and a's checkpoint is used from then on. Counting keys, their answers were never checked."""
    local, client, model = swarm
    config, honest = model.config, honest_of(client, 0)
    store = CheckpointStore(tmp_path, config, 0, SWARM)
    info = store.save(nearby(model.denoiser_for_block(0)), honest.step + 1)
    with sybil_nodes(SWARM, local.initial_peers, store, info, garbage_block(config, 0, scale=1.0), config, 2) as nodes:
        liars = {node.peer_id for node in nodes}
        wait_for(lambda: liars <= {h.peer_id for h in client.directory.hosts(0)}, 30, "the free keys' records")
        runner = generation_client(local, client, config)
        runner.witness = client.witness()
        runner.audit = LoneKeyAudit(draws=random.Random(2))  # draws 0.956 (block 0), 0.948 (block 1), 0.057 (block 0)
        a = next(h for h in serving(client, 0) if h.announcement.public_name == "a")
        runner.replicas.ban(a, "busy (the harness)", 600)  # so the strangers' checkpoint is the one chosen
        assert runner.choose(0).peer_id in liars
        runner.replicas.banned_until.pop(a.peer_id)
        b"".join(continue_text(runner, config, b"Swarms of", 5 * config.gen_len, steps_per_block=2, seed=8))
        liar_hosts = [h for h in client.directory.hosts(0) if h.peer_id in liars]
    assert all(runner.replicas.banned_until.get(p) == math.inf for p in liars), runner.replicas.banned_until
    assert runner.checks.banned == 2 and runner.checks.disagreements == 0, runner.checks  # together, on one audit
    assert runner.checks.lone_checked >= 1, runner.checks
    assert runner.used[0] == {info.sha256, honest.sha256}  # one lie used, then a's checkpoint
    credited = {c.subject: c.answers for c in runner.witness.attestation().contributions}
    assert not any(credited.get(owner_fingerprint(h.owner)) for h in liar_hosts), credited


def test_a_joiner_takes_a_better_block_stamped_far_ahead_but_not_its_step(swarm, tmp_path):
    """Issue 46, step inflation: a stranger trains lone host a's block 0 on and serves it stamped
    2 x step + 100. A joiner starts from its weights (they measure better) at a's step plus
    `STEP_LEAD` at most, under a checkpoint of its own: one record cannot move its schedule."""
    local, client, model = swarm
    config, honest = model.config, honest_of(client, 0)
    better = block_trainer(config, 0, load_corpus(local.data).windows("train", config), TrainConfig(steps=400))
    better.module.load_state_dict(model.denoiser_for_block(0).state_dict())
    better.step_count = honest.step
    train(better, 60)
    store = CheckpointStore(tmp_path, config, 0, SWARM)
    inflated = store.save(better.module, 2 * honest.step + 100)
    with HostileNode(SWARM, local.initial_peers) as node:
        node.serve_checkpoint(store, inflated)
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(0)}, 30, "the stranger's record")
        joiner = local.start_peer("inflation-joiner", "0", FAST_PEER)
        try:
            found = wait_for(lambda: [h for h in client.directory.hosts(0)
                                      if h.announcement.public_name == "inflation-joiner"
                                      and h.announcement.state != "joining"], 90, "the joiner")[0]  # fmt: skip
        finally:
            local.stop(joiner)
            node.leave(0)
    assert "from replica " + node.peer_id in joiner.log(), joiner.log()[-3000:]  # it took the stranger's weights
    started = found.announcement.checkpoint
    assert started.step == honest.step + STEP_LEAD and started.sha256 != inflated.sha256, found.announcement
    # its lineage: the weights came from the stranger's key alone, so its record is that key's voice
    assert found.announcement.taken_from == (owner_fingerprint(node.directory.owner_subkey),), found.announcement


def test_a_checkpoint_whose_download_runs_out_of_time_is_measured_again_later(swarm, monkeypatch):
    """Review of issue 26, finding 3: the only host the client can reach for a's checkpoint
    trickles its download (with a's chunk list, copied: the list passes). The measurement runs out of
    time without raising, marks the checkpoint failed for now, and measures it again (from a) once the
    delay is over."""
    local, client, model = swarm
    config, info = model.config, honest_of(client, 0)
    a = next(h for h in serving(client, 0) if h.announcement.public_name == "a")
    monkeypatch.setattr(vetting, "MEASURE_TIMEOUT_S", 3.0)
    monkeypatch.setattr(vetting, "RETRY_AFTER_S", 2.0)
    with HostileNode(SWARM, local.initial_peers) as node:
        copied = client.loop.run(ask_chunk_list(client.p2p, a, info, FIRST_BYTE_TIMEOUT_S), 60)  # anyone may ask
        node.serve(InfoServicer(lambda: node.info(0)), TricklingDownloads(0, size=info.size, hashes=copied.hashes))
        node.announce(0, state="serving", **checkpoint_of(info))
        wait_for(lambda: node.peer_id in {h.peer_id for h in client.directory.hosts(0)}, 30, "the trickler's record")
        trickler = next(h for h in client.directory.hosts(0) if h.peer_id == node.peer_id)
        checks = vetting.Vetting(client.p2p, client.loop, config, SpotCheck.from_source(local.data, config))
        assert checks.measure(0, [trickler]) == 0
    assert checks.known(info) and checks.failed[info] < math.inf
    wait_for(lambda: not checks.known(info), 10, "the delay to run out")
    assert checks.measure(0, [a]) == 1 and info in checks.passed and info not in checks.failed


def test_the_join_line_is_what_every_command_takes(swarm):
    local, _, _ = swarm
    assert local.join_args[:2] == ["--swarm", SWARM] and local.creator is not None
    for command, extra in (("swarm-status", []), ("swarm-generate", ["--max-bytes", "4", "hi"])):
        result = local.run(command, *extra)
        assert result.returncode == 0, (command, result.stderr[-2000:])


def test_a_client_remembers_a_bounded_number_of_failed_checkpoints(monkeypatch):
    """A stranger can announce any number of checkpoints that fail: the client keeps at most
    `REMEMBERED` of them, dropping those whose failure ran out first, then the oldest."""
    monkeypatch.setattr(vetting, "REMEMBERED", 8)
    checks = vetting.Vetting(None, None, ModelConfig())  # rejecting asks no peer
    bad = CheckpointInfo(step=0, sha256="f" * 64, size=1, chunks="f" * 64)

    def made_up(i: int) -> CheckpointInfo:
        return CheckpointInfo(step=i, sha256=f"{i:064x}", size=1, chunks=f"{i:064x}")

    checks.reject(bad, "it did not pass the spot check")
    for i in range(1, 30):
        checks.reject(made_up(i), "no host served it", seconds=0.0)
    assert len(checks.failed) <= 8 and checks.failed[bad] == math.inf  # the expired ones went first
    for i in range(30, 60):
        checks.reject(made_up(i), "it did not pass the spot check")
    assert len(checks.failed) == 8 and bad not in checks.failed  # then the oldest
    assert all(made_up(i) in checks.failed for i in range(52, 60))


def record_of(key: str, info: CheckpointInfo, peer_id: str | None = None) -> Host:
    """A serving host of block 0 under key `key` (its peer id `key` unless named) announcing `info`."""
    announcement = BlockAnnouncement(peer_id=peer_id or key, state="serving", step=info.step, checkpoint=info)
    return Host(0, announcement, math.inf, owner=key.encode())


def test_a_checkpoint_only_one_key_serves_is_used_once_measured_here_and_not_before():
    """`Vetting.usable` alone, without a swarm: two peer ids under one key are one key."""
    checks = vetting.Vetting(None, None, ModelConfig())
    info = CheckpointInfo(step=7, sha256="a" * 64, size=1, chunks="a" * 64)
    lone = [record_of("stranger", info)]
    candidate = Candidate(info, tuple(lone), plausible=True)
    assert not checks.usable(candidate, lone)
    assert not checks.usable(candidate, [*lone, record_of("stranger", info, peer_id="its second peer")])
    assert checks.usable(candidate, [*lone, record_of("honest", info)])
    checks.passed[info] = Measured(candidate, b"", lone[0], loss=1.0)
    assert checks.usable(candidate, lone)


def test_where_keys_are_free_a_checkpoint_two_keys_serve_is_used_only_once_measured_here():
    """`Vetting.usable` alone, in an open swarm (`keys_count` false: `SwarmDirectory.keys_count` says why)."""
    checks = vetting.Vetting(None, None, ModelConfig())
    info = CheckpointInfo(step=7, sha256="a" * 64, size=1, chunks="a" * 64)
    two = [record_of("sybil", info), record_of("another sybil", info)]
    candidate = Candidate(info, tuple(two), plausible=True)
    assert checks.usable(candidate, two) and not checks.usable(candidate, two, keys_count=False)
    checks.passed[info] = Measured(candidate, b"", two[0], loss=1.0)
    assert checks.usable(candidate, two, keys_count=False)


def test_a_checkpoint_no_host_served_in_time_is_due_for_another_measurement_once_the_delay_ends(monkeypatch):
    """`Vetting.measure` alone: no candidate came back (every download ran out of time)."""

    async def served_by_none(*args, **kwargs) -> list:
        return []

    monkeypatch.setattr(vetting, "measure_candidates", served_by_none)
    monkeypatch.setattr(vetting, "RETRY_AFTER_S", 0.0)
    loop = SimpleNamespace(run=lambda coro, timeout: asyncio.run(coro))
    checks = vetting.Vetting(None, loop, ModelConfig(), SpotCheck(torch.zeros(0)))
    info = CheckpointInfo(step=7, sha256="a" * 64, size=1, chunks="a" * 64)
    assert checks.measure(0, [record_of("busy", info)]) == 0
    assert info in checks.failed and not checks.known(info)  # failed for now, due again (the delay here is 0 s)


def test_a_strict_majority_of_answers_decides_and_a_tie_decides_nothing():
    z_in, honest, lie = torch.zeros(4), (torch.ones(4), None), (-torch.ones(4), None)
    assert majority({"liar": lie, "a": honest, "b": honest}, z_in, 1e-3) == ("a", ["liar"])
    assert majority({"liar": lie, "a": honest}, z_in, 1e-3) == (None, [])


def test_in_an_open_swarm_agreeing_keys_outvote_nobody_and_only_answers_checked_here_are_credited():
    """`cross_check.one_voice` alone (issue 57): two free keys agreeing on a lie against lone host
    a's answer are no majority: the answer computed here is used, they are banned for good and only
    a is credited. Answers that every key agrees on are used uncredited, unless audited or a key was
    not heard: then computed here, and keys that lied together are banned together."""
    z_in, honest, lie = torch.zeros(4), (torch.ones(4), None), (-torch.ones(4), None)
    right = (torch.ones(4), None)  # computed here: equal to the honest answer, and told apart from it by `is`
    here = lambda: right
    both_lie = Ban(("liar", "sybil"), CONTRADICTED, for_good=True)

    def verdict(answers: dict, complete: bool = True, audited: bool = False) -> tuple:
        used = one_voice(answers, complete, audited, z_in, 1e-3, here)
        return used.answer is right, used.credit, used.ban

    assert verdict({"liar": lie, "sybil": lie, "a": honest}) == (True, ("a",), both_lie)
    assert verdict({"a": honest, "liar": lie, "sybil": lie}) == (True, ("a",), both_lie)
    assert verdict({"liar": lie, "sybil": lie}) == (False, (), None)  # nobody contradicts them: used, not credited
    assert verdict({"liar": lie, "sybil": lie}, audited=True) == (True, (), both_lie)
    assert verdict({"liar": lie, "sybil": lie}, complete=False) == (True, (), both_lie)  # a busy: not heard
    assert verdict({"a": honest, "b": honest}, audited=True) == (True, ("a", "b"), None)
    assert verdict({"a": honest}) == (False, (), None) and verdict({"a": honest}, audited=True) == (True, ("a",), None)


def test_a_client_waits_once_for_a_ban_to_end_where_every_host_of_a_block_failed_a_moment_ago(swarm):
    """Every host of block 0 failed once (a moment's load, or a stranger's doing) and is banned
    for a while: generation waits for the first ban to end instead of failing; a block whose
    hosts are all banned for good fails at once."""
    local, client, model = swarm
    runner = generation_client(local, client, model.config)
    runner.replicas.ban_seconds = 2.0
    hosts = [h for h in client.directory.hosts(0) if h.announcement.checkpoint]  # earlier tests' strangers too
    for host in hosts:
        runner.replicas.ban(host, "failed once (the harness)")
    text = b"".join(continue_text(runner, model.config, b"Swarms of", model.config.gen_len, steps_per_block=2, seed=7))
    assert text == honest_text(model, b"Swarms of", model.config.gen_len, seed=7)
    for host in hosts:
        runner.replicas.ban(host, "shown to lie (the harness)", math.inf)
    with pytest.raises(SwarmError, match="no live peer serves block 0"):
        next(continue_text(runner, model.config, b"Swarms of", model.config.gen_len, steps_per_block=2, seed=7))


def over_two_fake_replicas(answer_of, **options) -> tuple[RemoteBlocks, Host, Host]:
    """A `RemoteBlocks` whose block 0 has two replicas, "first" (the fastest) and "second", of one
    checkpoint measured here, under one key (so no witness is asked); `answer_of(host)` (async) is
    what a request to a replica gets. No swarm: its loop runs each call with the call's deadline,
    as `EventLoopThread.run` does."""
    info = CheckpointInfo(step=7, sha256="a" * 64, size=1, chunks="a" * 64)
    first, second = record_of("key", info, peer_id="first"), record_of("key", info, peer_id="second")
    directory = SimpleNamespace(hosts=lambda block: [first, second], keys_count=True)
    loop = SimpleNamespace(run=lambda coro, timeout: asyncio.run(asyncio.wait_for(coro, timeout)))
    runner = RemoteBlocks(directory, None, loop, ModelConfig(), **options)
    runner.replicas.rtt.update({(first.peer_id, first.owner): 0.0, (second.peer_id, second.owner): 1.0})
    runner.vetting.passed[info] = Measured(Candidate(info, (first, second), plausible=True), b"", second, loss=1.0)
    runner._denoise = lambda host, request: answer_of(host)
    runner.audit = LoneKeyAudit(draws=SimpleNamespace(random=lambda: 1.0))  # failover alone: no answer is audited
    return runner, first, second


def ask_block_0(runner: RemoteBlocks):
    return runner(0, torch.zeros(1), torch.zeros(1), torch.zeros(2))


def test_a_replica_that_fails_is_banned_and_the_request_goes_to_another():
    """`RemoteBlocks.__call__` alone: the fastest replica fails once (killed, or refusing). The
    request goes to the other and the failed one is asked nothing more: unbanned, it would stay
    the chosen replica and be asked again for ever (the fake ends the test at its second request
    instead)."""
    asked, answer = [], (torch.zeros(1), None)

    async def answer_of(host: Host) -> tuple:
        asked.append(host.peer_id)
        if host.peer_id == "second":
            return answer
        if asked.count("first") > 1:
            pytest.fail(f"the replica that failed was asked again: {asked}")  # not an Exception: __call__ lets it out
        raise ConnectionError("the peer is gone")

    runner, _, second = over_two_fake_replicas(answer_of)
    assert ask_block_0(runner) is answer
    assert asked == ["first", "second"] and runner.choose(0) is second


def test_a_replica_that_never_answers_is_given_up_at_the_request_deadline_and_another_is_asked():
    """`RemoteBlocks.__call__` alone: the fastest replica takes the request and never answers (a
    stopped peer, or a stranger holding requests open). At `request_timeout` it is given up and
    banned, and the other answers; without that deadline the whole call would run out of time."""
    asked, answer = [], (torch.zeros(1), None)

    async def answer_of(host: Host) -> tuple:
        asked.append(host.peer_id)
        if host.peer_id == "first":
            await asyncio.Event().wait()  # silent for ever
        return answer

    runner, first, _ = over_two_fake_replicas(answer_of, request_timeout=0.5)
    assert ask_block_0(runner) is answer
    assert asked == ["first", "second"] and runner.replicas.banned(first.peer_id)
