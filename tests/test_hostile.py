"""A hostile replica in the swarm: its sync payloads are refused and the honest peer trains on.

The hostile peer is a real hivemind node in the test process that announces itself as a
replica of block 0 and answers every payload request with a well-formed payload full of NaN.
An honest replica that applied it would hold NaN weights after one step.
"""

from __future__ import annotations

import dataclasses

import conftest
import torch
from hivemind.utils.crypto import RSAPrivateKey
from safetensors.torch import load_file
from swarm_helpers import tiny_swarm, wait_for

from swarm.model.denoiser import ModelConfig, build_block
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.messages import PayloadReply
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht
from swarm.p2p.records import BlockAnnouncement
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoReplica, encode_payload
from swarm.sync.exchange import PayloadServicer


def poisoned_payload(config: ModelConfig) -> bytes:
    """A payload that fits block 0's parameters exactly, with every value NaN."""
    block = build_block(config, 0)
    for param in block.parameters():
        param.grad = torch.randn_like(param)
    replica = DeMoReplica(block, DeMoConfig())
    payload = replica.make_payload(lr=1e-3)
    nan = {name: dataclasses.replace(c, values=torch.full_like(c.values, float("nan"))) for name, c in payload.items()}
    return encode_payload(nan, value_bits=16)


def test_nan_payloads_from_a_hostile_replica_are_refused_and_training_goes_on(tmp_path):
    with tiny_swarm(tmp_path, "hostilesync", {"b": "1"}) as (local, _, client):
        directory = client.directory
        key, loop = RSAPrivateKey(), EventLoopThread()
        hostile = start_dht("hostilesync", NetworkOptions(initial_peers=local.initial_peers), key)
        p2p = loop.run(hostile.replicate_p2p(), 30)
        try:
            servicer = PayloadServicer(block=0, deadline=5)
            bad = poisoned_payload(ModelConfig(**conftest.TINY))

            async def answer_any_step(request):
                return PayloadReply(status="ok", payload=bad, fingerprint=b"hostile!")

            servicer._payload = answer_any_step  # the harness: every step's answer is the poisoned payload
            loop.run(servicer.add_p2p_handlers(p2p), 30)
            me = BlockAnnouncement(peer_id=hostile.peer_id.to_base58(), state="training", step=0)
            assert SwarmDirectory(hostile, "hostilesync", key).announce(0, me, lifetime_s=300, wait=True)

            extra = ["--sync", "demo", "--wait-for-replicas", "2", "--max-steps", "8", "--save-every", "8",
                     "--announce-period", "1", "--sync-deadline", "5"]
            honest = local.start_peer("honest", "0", extra)
            wait_for(lambda: any(h.announcement.public_name == "honest" and h.announcement.state == "serving"
                                 for h in directory.hosts(0)), 120, "the honest replica to finish 8 steps")
            log = honest.log()
            assert log.count("refused the step") >= 8, log[-2000:]
            weights = load_file(local.workdir / "honest" / "block_0_step_8.safetensors")
            assert all(torch.isfinite(t).all() for t in weights.values())
            assert honest.process.poll() is None  # still up, serving
        finally:
            loop.close(p2p)
            hostile.shutdown()
