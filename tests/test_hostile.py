"""A hostile replica among two honest ones: its sync replies never reach the honest trainers' weights.

The hostile replica is a real hivemind node in the test process (swarm.lab.attacks) that
announces itself as a replica of block 0 and answers every payload request with poison:
payloads full of NaN (an honest replica that applied one would hold NaN weights), or replies
that are garbage, off-schema, or claim a step of 10^12 (an honest replica that believed it
would jump there and, with --max-steps, stop training).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from swarm_helpers import tiny_swarm, wait_for

from swarm.lab.attacks import HostileNode, HostileReplica, LyingSyncReplies
from swarm.model.data import load_corpus
from swarm.sync.decoupled_momentum import DeMoConfig

HONEST = ["--sync", "demo", "--wait-for-replicas", "3", "--max-steps", "8", "--save-every", "8",
          "--announce-period", "1", "--sync-deadline", "5", "--average-every", "0"]  # fmt: skip


@pytest.mark.parametrize("attack", ["nan payloads", "lying replies"])
def test_a_hostile_replica_cannot_poison_or_derail_honest_ones(tmp_path, attack):
    with tiny_swarm(tmp_path, "hostilesync", {}) as (local, _, client):
        config = client.directory.wait_for_model(30)  # no peer was waited for: the bootstrap may not have published it yet
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
        if attack == "nan payloads":
            assert honest[0].log().count("refused the step") >= 8


def finished(client, replicas: int) -> list:
    done = [h.announcement for h in client.directory.hosts(0) if h.announcement.state == "serving"]
    return done if len(done) == replicas else []
