"""The sync vote of an open swarm, over real peers: two free keys beside a lone honest replica.

Each key is a real hivemind node in the test process (swarm.lab.attacks `NegatedEcho`) that
announces itself as a replica of block 0, fetches the honest replica's payload of each step
(`rpc_payload` serves anyone) and answers with it negated: two to one, they contradict it.
"""

from __future__ import annotations

import torch
from safetensors.torch import load_file
from swarm_helpers import tiny_swarm, wait_for

from swarm.lab.attacks import HostileNode, NegatedEcho
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.peer.config import PeerConfig
from swarm.peer.life import replica_trainer
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer
from swarm.sync.exchange import Exchange
from swarm.sync.in_process import LocalBoard
from swarm.sync.lockstep import DeMoSync
from swarm.sync.strategy import train_step

STEPS = 6


def test_a_lone_replica_beside_two_keys_that_send_its_own_payload_negated_trains_as_it_would_alone(tmp_path):
    """One honest peer at the defaults (an open swarm) and two negating keys. The vote is anchored
    on the replica's own update (swarm/sync/evidence.py), so both leave at the first step and
    every step is its own: its checkpoint is, within float noise, that of the same replica
    replayed here training alone. (A vote that counted keys left the honest one out and stepped
    it on their negation, up its loss, every step.)"""
    with tiny_swarm(tmp_path, "negatedecho", {}) as (local, _, client):
        config = client.directory.wait_for_model(30)
        with HostileNode("negatedecho", local.initial_peers) as a, HostileNode("negatedecho", local.initial_peers) as b:
            echoes = [NegatedEcho(node, config, 0, DeMoConfig(), 2e-3, [a.peer_id, b.peer_id]) for node in (a, b)]
            for node, echo in zip((a, b), echoes):
                node.serve(echo)
                node.announce(0, lifetime_s=300)
            options = ["--sync", "demo", "--wait-for-replicas", "3", "--max-steps", str(STEPS),
                       "--save-every", str(STEPS), "--announce-period", "1", "--sync-deadline", "5",
                       "--average-every", "0"]  # fmt: skip
            local.start_peer("r1", "0", options)
            (record,) = wait_for(lambda: finished(client), 150, "the honest replica to finish")
        assert all(len(echo.answered) >= STEPS - 1 for echo in echoes), [echo.answered for echo in echoes]
        trained = load_file(local.workdir / "r1" / f"block_0_step_{STEPS}.safetensors")
        alone = replayed_alone(config, load_corpus(local.data).windows("train", config), record.peer_id)
    assert max((trained[k] - alone[k]).abs().max().item() for k in alone) < 1e-6


def finished(client) -> list:
    """The honest replica's announcement once it is done training (the keys never are)."""
    return [h.announcement for h in client.directory.hosts(0) if h.announcement.state == "serving"]


def replayed_alone(config: ModelConfig, windows: Windows, peer_id: str) -> dict:
    """The weights of replica `peer_id` after STEPS lockstep DeMo steps with no other replica, as a
    peer at the defaults takes them (its start, batches and schedule), in one thread as the peers compute."""
    trainer = replica_trainer(config, 0, windows, PeerConfig(max_steps=STEPS).train_config(), peer_id)
    exchange = Exchange(LocalBoard(deadline=1.0).transport(peer_id), peer_id, replica_ids=list)
    sync = DeMoSync(DeMoOptimizer(trainer.module, DeMoConfig(), trainer.config.lr), exchange)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(STEPS):
            train_step(trainer, sync)
    finally:
        torch.set_num_threads(threads)
    return trainer.module.state_dict()
