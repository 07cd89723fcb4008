"""A hostile replica among two honest ones: its sync replies never reach the honest trainers' weights.

The hostile replica is a real hivemind node in the test process (swarm.lab.attacks) that
announces itself as a replica of block 0 and answers every payload request with poison:
payloads full of NaN (an honest replica that applied one would hold NaN weights), or replies
that are garbage, off-schema, or claim a step of 10^12 (an honest replica that believed it
would jump there and, with --max-steps, stop training). Beside a lone honest replica, two keys
that claim a step 1000 ahead of every step asked move it within its jump budget alone, and two
keys that send its own payload back negated, or payloads that decode to nothing, leave it
training as it would alone.
"""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file
from swarm_helpers import tiny_swarm, wait_for

from swarm.lab.attacks import EmptyPayloads, HostileNode, HostileReplica, JumpClaims, LyingSyncReplies, NegatedEcho
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.peer.config import PeerConfig
from swarm.peer.replica import replica_trainer
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer
from swarm.sync.exchange import JUMP_SHARE, Exchange, allowance_for
from swarm.sync.in_process import LocalBoard
from swarm.sync.lockstep import DeMoSync
from swarm.sync.strategy import train_step

HONEST = ["--sync", "demo", "--wait-for-replicas", "3", "--max-steps", "8", "--save-every", "8",
          "--announce-period", "1", "--sync-deadline", "5", "--average-every", "0"]  # fmt: skip


@pytest.mark.parametrize("attack", ["nan payloads", "lying replies"])
def test_a_hostile_replica_cannot_poison_or_derail_honest_ones(tmp_path, attack):
    with tiny_swarm(tmp_path, "hostilesync", {}) as (local, _, client):
        # no peer was waited for: the bootstrap may not have published it yet
        config = client.directory.wait_for_model(30)
        with HostileNode("hostilesync", local.initial_peers) as node:
            if attack == "nan payloads":
                windows = load_corpus(local.data).windows("train", config)
                node.serve(HostileReplica(node, config, 0, DeMoConfig(), 2e-3, "nan", windows))
            else:
                node.serve(LyingSyncReplies(0))
            node.announce(0, lifetime_s=300)
            honest = [local.start_peer(name, "0", HONEST) for name in ("r1", "r2")]
            finals = wait_for(lambda: finished(client, 2), 150, "the honest replicas to finish 8 steps")
        assert sorted(a.step for a in finals) == [8, 8], finals  # nobody jumped to the claimed 10^12
        r1, r2 = (load_file(local.workdir / name / "block_0_step_8.safetensors") for name in ("r1", "r2"))
        assert all(torch.isfinite(t).all() for t in r1.values())
        assert all(torch.equal(r1[k], r2[k]) for k in r1)  # both applied exactly the honest payloads
        assert all(peer.process.poll() is None for peer in honest)  # still up, serving
        if attack == "nan payloads":  # refused; from then on not waited for (a payload that comes is still read)
            assert "refused the step" in honest[0].log()


JUMP_RUN = 30  # steps the lone replica trains beside keys that claim a step ahead
DEFAULT_SCHEDULE = PeerConfig().train_config().steps  # the schedule of a peer run without --max-steps


@pytest.mark.parametrize("schedule", [DEFAULT_SCHEDULE, None])
def test_two_keys_reporting_a_step_ahead_on_every_step_move_a_lone_replica_within_its_jump_budget(tmp_path, schedule):
    """Issue 57: two free keys answer every other poll of a lone honest replica (its defaults) with "gone,
    the newest step is the one asked plus 1000", and the others with junk in time, so that they stay
    waited for (swarm/sync/transport.py: a key that never delivers is heard once; a "gone" answer stands
    until the replica's step nears the step it named). Before the jump budget its step moved 1000 a step
    and a --max-steps run ended after its first step. Now its step moves at most its allowance (a
    tenth of its schedule, 1000 at most: one late joiner's jump on the default schedule, none on a
    30-step one) plus `JUMP_SHARE` of the steps trained, in all; its last step's rate is above the
    floor; and the run trains every one of its --max-steps."""
    options = ["--max-steps", str(JUMP_RUN), "--save-every", str(JUMP_RUN), "--announce-period", "1"]
    options += ["--schedule-steps", str(schedule)] if schedule else []  # else its schedule spans --max-steps
    with tiny_swarm(tmp_path, "jumpclaims", {}) as (local, _, client):
        client.directory.wait_for_model(30)  # no peer was waited for: the bootstrap may not have published it yet
        with HostileNode("jumpclaims", local.initial_peers) as a, HostileNode("jumpclaims", local.initial_peers) as b:
            for node in (a, b):
                node.serve(JumpClaims(0))
                node.announce(0, lifetime_s=300)
            honest = local.start_peer("h", "0", options)
            (final,) = wait_for(lambda: finished(client, 1), 150, "the honest replica to finish its steps")
        log = honest.log()
    trained = re.search(r"trained (\d+) steps, to step (\d+)", log)
    assert trained and int(trained[1]) == JUMP_RUN and int(trained[2]) == final.step, log[-2000:]
    config = PeerConfig(max_steps=JUMP_RUN, schedule_steps=schedule).train_config()
    assert final.step <= JUMP_RUN + allowance_for(config.steps) + JUMP_SHARE * JUMP_RUN, final
    assert config.lr_at(final.step - 1) > 1.01 * config.lr * config.min_lr_fraction
    assert "more than its jumps may still take" in log  # the keys were asked, and refused
    assert ("jumping from" in log) == (schedule is not None)  # on the default schedule, one late joiner's jump


ECHO_STEPS = 6  # steps the lone replica trains beside the two keys


@pytest.mark.parametrize("keys", ["negated", "empty"])
def test_two_keys_that_send_a_lone_replicas_payload_negated_or_nothing_leave_it_training_as_alone(tmp_path, keys):
    """Issue 57: two free keys fetch a lone honest replica's payload of each step (`rpc_payload`
    serves anyone) and answer with it negated, or answer at once with a payload that decodes to
    nothing. Two of three senders, they were a majority of its vote: negated, they contradicted it
    out of the vote and stepped it up its loss; empty, the median was 0 and it moved by weight
    decay alone. At the peer's defaults a vote that keeps no more than a tenth of its update is set
    aside (swarm/sync/evidence.py `keeps_own`), and a sender set aside again and again is waited
    for less and less (swarm/sync/transport.py `Punctuality.set_aside`), so every step is its own:
    its checkpoint is, within float noise, that of the same replica replayed here training alone."""
    options = ["--sync", "demo", "--wait-for-replicas", "3", "--max-steps", str(ECHO_STEPS), "--save-every",
               str(ECHO_STEPS), "--announce-period", "1", "--sync-deadline", "5", "--average-every", "0"]  # fmt: skip
    with tiny_swarm(tmp_path, "turnedecho", {}) as (local, _, client):
        config = client.directory.wait_for_model(30)
        with HostileNode("turnedecho", local.initial_peers) as a, HostileNode("turnedecho", local.initial_peers) as b:
            servicers = [NegatedEcho(node, config, 0, DeMoConfig(), 2e-3, [a.peer_id, b.peer_id]) if keys == "negated"
                         else EmptyPayloads(0) for node in (a, b)]  # fmt: skip
            for node, servicer in zip((a, b), servicers):
                node.serve(servicer)
                node.announce(0, lifetime_s=300)
            honest = local.start_peer("r1", "0", options)
            (record,) = wait_for(lambda: finished(client, 1), 150, "the honest replica to finish")
        if keys == "negated":
            assert all(0 in echo.answered for echo in servicers), [e.answered for e in servicers]  # the first vote's
        log = honest.log()
        # the keys' payloads came to its first step's vote, which set them aside (`keeps_own`); from then
        # on it waited for them less and less (transport.py `Punctuality.set_aside`), and stepped alone
        assert "step 0: no payload from" not in log and "no payload from 2 of the 2 replicas" in log, log[-3000:]
        trained = load_file(local.workdir / "r1" / f"block_0_step_{ECHO_STEPS}.safetensors")
        alone = replayed_alone(config, load_corpus(local.data).windows("train", config), record.peer_id)
    assert max((trained[k] - alone[k]).abs().max().item() for k in alone) < 1e-6


def replayed_alone(config: ModelConfig, windows: Windows, peer_id: str) -> dict:
    """The weights of replica `peer_id` after ECHO_STEPS lockstep DeMo steps with no other replica,
    as a peer at the defaults takes them (its start, batches and schedule), in one thread as the peers compute."""
    trainer = replica_trainer(config, 0, windows, PeerConfig(max_steps=ECHO_STEPS).train_config(), peer_id)
    exchange = Exchange(LocalBoard(deadline=1.0).transport(peer_id), peer_id, replica_ids=list)
    sync = DeMoSync(DeMoOptimizer(trainer.module, DeMoConfig(), trainer.config.lr), exchange)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(ECHO_STEPS):
            train_step(trainer, sync)
    finally:
        torch.set_num_threads(threads)
    return trainer.module.state_dict()


def finished(client, replicas: int) -> list:
    done = [h.announcement for h in client.directory.hosts(0) if h.announcement.state == "serving"]
    return done if len(done) == replicas else []
