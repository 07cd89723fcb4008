"""The outer step in one process: the wire format, error feedback, the majority's range, refused payloads."""

import math

import msgpack
import pytest
import torch

from swarm.model.denoiser import build_block
from swarm.sync.decoupled_momentum import PayloadError
from swarm.sync.pseudo_gradient import OuterConfig, OuterOptimizer, majority_mean


def moved_replica(config, outer: OuterConfig, seed: int = 0, scale: float = 1e-3) -> OuterOptimizer:
    """A replica whose weights moved away from its anchor by a random change of about `scale`."""
    torch.manual_seed(0)
    replica = OuterOptimizer(build_block(config, 0), outer, lr=2e-3)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in replica.params.values():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return replica


@pytest.mark.parametrize("compression, bits", [("dct", 2), ("dct", 1), ("raw", 2), ("none", 2)])
def test_what_is_sent_and_what_stays_make_up_the_change(tiny_config, compression, bits):
    replica = moved_replica(tiny_config, OuterConfig(compression=compression, value_bits=bits))
    change = {name: replica.anchor[name] - p.detach() for name, p in replica.params.items()}
    payload = replica.make_payload()
    sent = replica.decode(payload)
    for name in change:
        assert torch.allclose(sent[name] + replica.error[name], change[name], atol=1e-7), name
    if compression == "none":
        assert all(torch.equal(sent[n], change[n]) for n in change)  # float32, exact
    else:  # and what is sent is a small part: far fewer bytes than the change in float32
        assert len(payload) < 0.05 * 4 * sum(c.numel() for c in change.values())
    if compression == "raw":
        assert sum(s.count_nonzero().item() for s in sent.values()) < 0.05 * sum(c.numel() for c in change.values())


def test_payload_size_follows_top_k_and_bits(tiny_config):
    sizes = {(k, bits): len(moved_replica(tiny_config, OuterConfig(top_k=k, value_bits=bits)).make_payload())
             for k in (32, 128) for bits in (1, 2)}  # fmt: skip
    assert sizes[32, 1] < sizes[32, 2] < sizes[128, 2]
    assert sizes[128, 1] < sizes[128, 2]


def test_two_replicas_get_the_plain_mean():
    a, b = torch.randn(1000), torch.randn(1000)
    assert torch.allclose(majority_mean([a, b]), (a + b) / 2)


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_a_hostile_minority_cannot_push_a_coordinate_beyond_the_honest_replicas(n):
    """With f < n/2 hostile values per coordinate, the result stays within the honest values'
    range, and where a strict majority agrees on a direction, it goes that way."""
    generator = torch.Generator().manual_seed(n)
    hostile = (n - 1) // 2
    honest = [torch.randn(5000, generator=generator) for _ in range(n - hostile)]
    for attack in (1e3, -1e3):
        result = majority_mean(honest + [torch.full((5000,), attack)] * hostile)
        stacked = torch.stack(honest)
        assert (result <= stacked.max(dim=0).values).all() and (result >= stacked.min(dim=0).values).all()
        all_values = torch.stack(honest + [torch.full((5000,), attack)] * hostile)
        up = (all_values > 0).sum(dim=0) > n // 2
        down = (all_values < 0).sum(dim=0) > n // 2
        assert (result[up] > 0).all() and (result[down] < 0).all()


def test_replicas_that_apply_the_same_payloads_hold_the_same_weights(tiny_config):
    outer = OuterConfig()
    replicas = [moved_replica(tiny_config, outer, seed=s) for s in range(3)]
    wires = [r.make_payload() for r in replicas]
    for replica in replicas:
        replica.apply([replica.decode(w) for w in wires])
    for name in replicas[0].params:
        assert torch.equal(replicas[0].params[name], replicas[1].params[name])
        assert torch.equal(replicas[0].params[name], replicas[2].anchor[name])


def test_a_round_applied_late_keeps_the_local_steps_taken_since_and_the_same_anchor(tiny_config):
    """Overlapped outer steps: replica 0 takes two more local steps before the round comes in;
    its anchor is the others', its weights the anchor plus those steps."""
    replicas = [moved_replica(tiny_config, OuterConfig(), seed=s) for s in range(3)]
    wires, sent_from = [r.make_payload() for r in replicas], replicas[0].weights()
    with torch.no_grad():
        for param in replicas[0].params.values():
            param.add_(torch.randn(param.shape) * 1e-3)
    progress = replicas[0].progress_since(sent_from)
    for replica in replicas:
        replica.apply([replica.decode(w) for w in wires], progress if replica is replicas[0] else None)
    for name, param in replicas[0].params.items():
        assert torch.equal(replicas[0].anchor[name], replicas[1].anchor[name])
        assert torch.allclose(param, replicas[1].params[name] + progress[name], atol=1e-7)
        assert not torch.equal(param, replicas[1].params[name])
    no_progress = replicas[1].progress_since(replicas[1].weights())
    replicas[1].apply([replicas[1].decode(w) for w in wires], no_progress)  # none since: exactly the anchor
    assert all(torch.equal(p, replicas[1].anchor[n]) for n, p in replicas[1].params.items())


def test_bad_payloads_are_refused(tiny_config):
    replica = moved_replica(tiny_config, OuterConfig())
    good = msgpack.unpackb(replica.make_payload())
    huge = moved_replica(tiny_config, OuterConfig(), scale=1.0).make_payload()  # moved 1.0: no honest replica can
    other_bits = moved_replica(tiny_config, OuterConfig(value_bits=1)).make_payload()
    nan = moved_replica(tiny_config, OuterConfig(), scale=float("nan")).make_payload()
    bad = {
        "changes no honest replica makes": huge,
        "NaN": nan,
        "other value bits": other_bits,
        "other compression": msgpack.packb({**good, "c": "raw"}),
        "truncated": msgpack.packb({**good, "b": good["b"][:-20]}),
        "trailing data": msgpack.packb({**good, "b": good["b"] + bytes(40)}),
        "garbage": b"\x00\x01garbage",
    }
    replica.decode(msgpack.packb(good))
    for what, data in bad.items():
        with pytest.raises(PayloadError):
            replica.decode(data)
            pytest.fail(f"accepted a payload with {what}")
    assert math.isfinite(sum(p.sum().item() for p in replica.params.values()))
