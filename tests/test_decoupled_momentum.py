"""DeMo replicas in one process: the wire format, replicas that stay identical, refused payloads."""

import copy
import dataclasses
import itertools
import math

import msgpack
import pytest
import torch

from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.train import diffusion_loss_fn
from swarm.sync import decoupled_momentum
from swarm.sync.compression import decompress, from_tiles, to_tiles
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer, PayloadError, decode_payload, encode_payload
from swarm.sync.evidence import majority_mean


def replicas(config, n: int, demo: DeMoConfig):
    torch.manual_seed(0)
    first = build_block(config, 0)
    blocks = [first] + [build_block(config, 0) for _ in range(n - 1)]
    for block in blocks[1:]:
        block.load_state_dict(first.state_dict())
    return blocks, [DeMoOptimizer(b, demo, lr=2e-3) for b in blocks]


def senders(payloads) -> list:
    """Payloads as gathered: (sender, payload), the senders r0, r1, ..."""
    return [(f"r{i}", payload) for i, payload in enumerate(payloads)]


def directions(replica: DeMoOptimizer, gathered, own: str = "r0") -> tuple[list[str], dict]:
    """The voters and the step's direction of each parameter, in its shape (`DeMoOptimizer.step`,
    which keeps the records as `apply` does; 0 for a parameter nobody sent)."""
    voters, steps = replica.step(gathered, own)
    return voters, {name: from_tiles(steps[name], p.shape) if name in steps else torch.zeros_like(p)
                    for name, p in replica.params.items()}  # fmt: skip


def unit_rms(update: torch.Tensor) -> torch.Tensor:
    """An update scaled to an RMS of 1, as the step scales each parameter's (0 stays 0)."""
    rms = update.pow(2).mean().sqrt()
    return update / rms if rms > 0 else update


def backward(block, windows, seed: int) -> float:
    generator = torch.Generator().manual_seed(seed)
    block.zero_grad(set_to_none=True)
    loss = diffusion_loss_fn(block, 0)(windows.sample(8, generator), generator)
    loss.backward()
    return loss.item()


@pytest.mark.parametrize("value_bits", [16, 1])
def test_payload_survives_the_wire(tiny_config, tiny_windows, value_bits):
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig(value_bits=value_bits))
    backward(blocks[0], tiny_windows, 0)
    payload = replica.make_payload(lr=2e-3)
    decoded = decode_payload(encode_payload(payload, value_bits), replica)
    for name, sent in payload.items():
        assert torch.equal(decoded[name].indices, sent.indices)
        assert torch.equal(decoded[name].values.float(), sent.values.float())


@pytest.mark.parametrize("value_bits", [16, 1])
def test_replicas_that_gather_every_payload_stay_identical_and_learn(tiny_config, tiny_windows, value_bits):
    demo = DeMoConfig(value_bits=value_bits, step_lr=2e-3)
    blocks, reps = replicas(tiny_config, 2, demo)
    losses = []
    for step in range(40):
        wires = []
        for index, (block, replica) in enumerate(zip(blocks, reps)):  # different data on each replica
            losses.append(backward(block, tiny_windows, seed=1000 * index + step))
            wires.append(encode_payload(replica.make_payload(lr=2e-3), value_bits))
        for index, replica in enumerate(reps):  # two honest senders keep each other's vote
            assert replica.apply(senders(decode_payload(w, replica) for w in wires), f"r{index}") == ["r0", "r1"]
        agreed, steps = reps[0].kept.record[("r0", "r1")]
        assert agreed / steps > 3 * demo.kept_at, step  # the step keeps half of an update or more (seen: 0.51-0.65)
    for a, b in zip(blocks[0].parameters(), blocks[1].parameters()):
        assert torch.equal(a, b)
    assert sum(losses[-10:]) / 10 < 0.9 * sum(losses[:10]) / 10


def test_three_replicas_that_gather_every_payload_stay_bit_identical(tiny_config, tiny_windows):
    """The vote of three (decoded a chunk at a time, `_majorities`) gives every replica the same step."""
    blocks, reps = replicas(tiny_config, 3, DeMoConfig())
    for step in range(5):
        wires = []
        for index, (block, replica) in enumerate(zip(blocks, reps)):
            backward(block, tiny_windows, seed=1000 * index + step)
            wires.append(encode_payload(replica.make_payload(lr=2e-3), 16))
        for index, replica in enumerate(reps):
            assert replica.apply(senders(decode_payload(w, replica) for w in wires), f"r{index}") == ["r0", "r1", "r2"]
    for other in blocks[1:]:
        for a, b in zip(blocks[0].parameters(), other.parameters()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("chunk", [1, 4096])
def test_the_step_of_three_voters_is_what_their_majority_vouches_for_at_rms_1_whatever_the_chunk(
    tiny_config, tiny_windows, monkeypatch, chunk
):
    """The voters' decoded updates are combined DECODE_CHUNK values at a time (one tile, a few):
    each gives, bit for bit, the step computed from the whole group at once, and that step is
    each parameter's `majority_mean` of the voters' decoded updates, scaled to RMS 1, at the rate."""
    demo = DeMoConfig()
    blocks, reps = replicas(tiny_config, 3, demo)
    for index, block in enumerate(blocks):
        backward(block, tiny_windows, seed=index)
    gathered = senders(decode_payload(encode_payload(r.make_payload(lr=2e-3), 16), reps[0]) for r in reps)
    whole = copy.deepcopy(reps[0])
    expected = {}
    for name, param in blocks[0].named_parameters():
        direction = unit_rms(majority_mean([unit_rms(decompress(payload[name])) for _, payload in gathered]))
        expected[name] = param.detach() * (1 - demo.step_lr * demo.weight_decay) - demo.step_lr * direction
    whole_voters, whole_steps = whole.step(gathered, "r0")
    monkeypatch.setattr(decoupled_momentum, "DECODE_CHUNK", chunk)
    voters, steps = reps[0].step(gathered, "r0")
    assert voters == whole_voters == ["r0", "r1", "r2"]
    for name in steps:
        assert torch.equal(steps[name], whole_steps[name]), name
    assert reps[1].apply(gathered, "r1") == ["r0", "r1", "r2"]
    for name, param in blocks[1].named_parameters():
        torch.testing.assert_close(param.detach(), expected[name], rtol=0, atol=1e-7, msg=name)


def test_bad_payloads_are_refused(tiny_config, tiny_windows):
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig())
    backward(blocks[0], tiny_windows, 0)
    payload = replica.make_payload(lr=2e-3)
    good = msgpack.unpackb(encode_payload(payload, 16))

    def with_entry(name, **changes):
        return encode_payload({**payload, name: dataclasses.replace(payload[name], **changes)}, 16)

    first = next(iter(payload))
    widest = max(payload, key=lambda n: payload[n].indices.shape[1])  # most coefficients kept per tile
    odd_tile = next(n for n, c in payload.items() if (c.tile[0] * c.tile[1]) & (c.tile[0] * c.tile[1] - 1))
    largest_code = 2 ** math.ceil(math.log2(payload[odd_tile].tile[0] * payload[odd_tile].tile[1])) - 1  # > tile size
    beyond = payload[odd_tile].indices.clone()
    beyond[:, -1] = largest_code  # still sorted, each once: only the range check refuses it
    bad = {
        "NaN values": with_entry(first, values=torch.full_like(payload[first].values, float("nan"))),
        "huge values": with_entry(first, values=torch.full_like(payload[first].values, 1e6)),
        "values no honest replica sends": with_entry(first, values=torch.full_like(payload[first].values, 50 * 2e-3)),
        "index out of range": with_entry(odd_tile, indices=beyond),
        "repeated index": with_entry(widest, indices=torch.zeros_like(payload[widest].indices)),
        "unknown parameter": msgpack.packb({**good, "p": [999]}),
        "repeated parameter": msgpack.packb({**good, "p": good["p"][:1] * 2}),
        "parameters not a list": msgpack.packb({**good, "p": 5}),
        "truncated": msgpack.packb({**good, "b": good["b"][:-20]}),
        "trailing data": msgpack.packb({**good, "b": good["b"] + bytes(40)}),
        "other value bits": msgpack.packb({**good, "v": 1}),
        "garbage": b"\x00\x01garbage",
    }
    assert decode_payload(encode_payload(payload, 16), replica).keys() == payload.keys()
    for what, data in bad.items():
        with pytest.raises(PayloadError):
            decode_payload(data, replica)
            pytest.fail(f"accepted a payload with {what}")
    other = ModelConfig(**{**tiny_config.to_dict(), "d_model": 64, "n_heads": 2})
    _, (other_replica,) = replicas(other, 1, DeMoConfig())
    with pytest.raises(PayloadError):
        decode_payload(encode_payload(payload, 16), other_replica)


@pytest.mark.parametrize("attack", ["negated and as large as allowed", "random signs"])
def test_one_hostile_payload_cannot_outvote_two_honest_ones(tiny_config, tiny_windows, attack):
    """Wherever two honest replicas agree on a coordinate's direction, the step goes their way,
    whatever a third sends within the wire's limits."""
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig())
    backward(blocks[0], tiny_windows, 0)
    honest = replica.make_payload(lr=2e-3)
    backward(blocks[0], tiny_windows, 1)
    other_honest = replica.make_payload(lr=2e-3)
    largest = 0.95 * replica.max_value  # as large as allowed after rounding to bfloat16
    if attack == "random signs":
        hostile = {
            n: dataclasses.replace(c, values=(torch.randint(0, 2, c.values.shape) * 2 - 1).to(c.values.dtype) * largest)
            for n, c in honest.items()
        }
    else:
        hostile = {
            n: dataclasses.replace(c, values=(-c.values.float().sign() * largest).to(c.values.dtype))
            for n, c in honest.items()
        }
    wires = [encode_payload(p, 16) for p in (honest, other_honest, hostile)]
    _, steps = directions(replica, senders(decode_payload(w, replica) for w in wires))
    for name in replica.params:
        moved = steps[name].sign()  # +1 where the step goes down the update
        a, b = decompress(honest[name]).sign(), decompress(other_honest[name]).sign()
        agreed = (a == b) & (a != 0)
        assert torch.equal(moved[agreed], a[agreed]), name


def test_a_hostile_voter_that_spends_its_whole_weight_on_one_tile_cannot_turn_it_against_two_honest_ones(
    tiny_config, tiny_windows, monkeypatch
):
    """Each voter weighs an update of RMS 1 per parameter (`unit_values`), so a stranger that sends
    one coefficient of one tile, on indices neither honest replica sent (no sign for the record to
    contradict), makes that tile's update many times the honest ones there. The clip of
    `majority_mean` keeps every coordinate the two honest updates agree on going their way; the
    plain mean of the three (the clip alone removed) turns part of that tile against them."""
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig())
    backward(blocks[0], tiny_windows, 0)
    honest = replica.make_payload(lr=2e-3)
    backward(blocks[0], tiny_windows, 1)
    other_honest = replica.make_payload(lr=2e-3)

    def agreed(name: str) -> torch.Tensor:  # where both honest updates go one way, in the parameter's shape
        a, b = (decompress(p[name]) for p in (honest, other_honest))
        return (a.sign() == b.sign()) & (a != 0)

    # the tile of a parameter of several where the honest two agree on the most coordinates
    name, tile = max(((n, t) for n, c in honest.items() if c.indices.shape[0] > 1 for t in range(c.indices.shape[0])),
                     key=lambda at: int(to_tiles(agreed(at[0]))[0][at[1]].sum()))  # fmt: skip
    a, sent = decompress(honest[name]), honest[name]
    used = set(sent.indices[tile].tolist()) | set(other_honest[name].indices[tile].tolist())
    free = [i for i in range(math.prod(sent.tile)) if i not in used][: sent.indices.shape[1]]
    indices, values = torch.zeros_like(sent.indices), torch.zeros(sent.values.shape)
    indices[:] = torch.arange(sent.indices.shape[1])  # distinct indices everywhere, zero values but one
    indices[tile] = torch.tensor(free)
    values[tile, 0] = 1.0
    probe = dataclasses.replace(sent, indices=indices, values=values.to(sent.values.dtype))
    against = -float((decompress(probe).sign() * a.sign())[agreed(name)].sum().sign())  # its pattern against theirs
    values[tile, 0] = against * 0.95 * replica.max_value
    hostile = {n: dataclasses.replace(c, values=torch.zeros_like(c.values)) for n, c in honest.items()}
    hostile[name] = dataclasses.replace(probe, values=values.to(sent.values.dtype))
    gathered = senders(decode_payload(encode_payload(p, 16), replica) for p in (honest, other_honest, hostile))

    def turned() -> int:
        voters, steps = directions(copy.deepcopy(replica), gathered)
        assert voters == ["r0", "r1", "r2"]  # nothing but the vote's rule stands between
        return int((steps[name].sign() != a.sign())[agreed(name)].sum())

    assert turned() == 0
    monkeypatch.setattr(decoupled_momentum, "majority_mean", lambda changes: sum(changes) / len(changes))
    assert turned() > 0


@pytest.mark.parametrize("value_bits", [16, 1])
@pytest.mark.parametrize("attack", ["negated", "largest values against it"])
def test_a_payload_the_others_contradict_leaves_the_vote(tiny_config, tiny_windows, value_bits, attack):
    """Two honest payloads and a third replica's update turned against itself: the third leaves
    the vote, so the step is the two honest updates' mean alone; where they disagree the hostile
    would have decided (the median of three is the hostile's value wherever it lies between)."""
    blocks, reps = replicas(tiny_config, 3, DeMoConfig(value_bits=value_bits))
    payloads = []
    for index, (block, replica) in enumerate(zip(blocks, reps)):
        backward(block, tiny_windows, seed=index)
        payloads.append(replica.make_payload(lr=2e-3))
    largest = 0.95 * (1.0 if value_bits == 1 else reps[0].max_value)
    flip = (lambda v: -v) if attack == "negated" else (lambda v: -v.sign() * largest)
    hostile = {
        n: dataclasses.replace(c, values=flip(c.values.float()).to(c.values.dtype)) for n, c in payloads[2].items()
    }
    wires = [encode_payload(p, value_bits) for p in (payloads[0], payloads[1], hostile)]
    replica = reps[0]
    gathered = senders(decode_payload(w, replica) for w in wires)
    voters, steps = directions(replica, gathered)
    assert voters == ["r0", "r1"]
    disagreements = 0
    for name in replica.params:
        a, b, c = (unit_rms(decompress(gathered[i][1][name])) for i in range(3))
        torch.testing.assert_close(steps[name], unit_rms(a + b), rtol=1e-5, atol=1e-6, msg=name)
        disagreements += int((majority_mean([a, b, c]).sign() != (a + b).sign()).sum())
    assert disagreements > 0


@pytest.mark.parametrize("value_bits", [16, 1])
def test_honest_replicas_all_keep_their_vote(tiny_config, tiny_windows, value_bits):
    """Three honest replicas on different data: none is ever left out of the vote."""
    blocks, reps = replicas(tiny_config, 3, DeMoConfig(value_bits=value_bits))
    for step in range(40):
        wires = []
        for index, (block, replica) in enumerate(zip(blocks, reps)):
            backward(block, tiny_windows, seed=1000 * index + step)
            wires.append(encode_payload(replica.make_payload(lr=2e-3), value_bits))
        for index, replica in enumerate(reps):
            gathered = senders(decode_payload(w, replica) for w in wires)
            assert replica.apply(gathered, f"r{index}") == ["r0", "r1", "r2"], (step, replica.evidence.record)
    for a, b in zip(blocks[0].parameters(), blocks[2].parameters()):
        assert torch.equal(a, b)


def negated_runs(config, windows, demo: DeMoConfig, steps: int) -> tuple[list[list[str]], list]:
    """Three replicas on different data, the third sending its update negated every step: the
    voters of each step as the first replica saw them, and the two honest blocks."""
    blocks, reps = replicas(config, 3, demo)
    voters = []
    for step in range(steps):
        payloads = []
        for index, (block, replica) in enumerate(zip(blocks, reps)):
            backward(block, windows, seed=1000 * index + step)
            payloads.append(replica.make_payload(lr=2e-3))
        payloads[2] = {
            n: dataclasses.replace(c, values=(-c.values.float()).to(c.values.dtype)) for n, c in payloads[2].items()
        }
        wires = [encode_payload(p, demo.value_bits) for p in payloads]
        for index in (1, 0):  # the first replica's voters are kept
            replica = reps[index]
            step_voters = replica.apply(senders(decode_payload(w, replica) for w in wires), f"r{index}")
        voters.append(step_voters)
    return voters, blocks[:2]


def test_a_sender_the_others_contradict_over_several_steps_leaves_the_vote_though_no_step_alone_shows_it(
    tiny_config, tiny_windows
):
    """A hostile payload shares few coefficients with each honest one in a step; the record of
    the steps before adds up the evidence. `min_shared` is set just above what one step shares
    (the most the first step shares: later steps share fewer, as the momenta settle), so no step
    alone is evidence enough and only the record can eject the sender."""
    blocks, reps = replicas(tiny_config, 3, DeMoConfig())
    shared = []
    for index, (block, replica) in enumerate(zip(blocks, reps)):
        backward(block, tiny_windows, seed=1000 * index)
        shared.append(replica.make_payload(lr=2e-3))
    reps[0].apply(senders(shared), "r0")
    most_in_one_step = max(s for pair, (_, s) in reps[0].evidence.record.items() if "r2" in pair)
    demo = DeMoConfig(min_shared=int(most_in_one_step) + 1)
    voters, honest = negated_runs(tiny_config, tiny_windows, demo, 12)
    assert voters[0] == ["r0", "r1", "r2"]  # one step is not evidence enough
    assert all(v == ["r0", "r1"] for v in voters[6:]), voters  # the steps before are
    for a, b in zip(*(h.parameters() for h in honest)):
        assert torch.equal(a, b)


def negate(payload):
    return {n: dataclasses.replace(c, values=(-c.values.float()).to(c.values.dtype)) for n, c in payload.items()}


def test_of_two_senders_a_contradicting_one_leaves_and_the_replica_steps_on_its_own(tiny_config, tiny_windows):
    """One replica and a stranger that sends its own honest update negated, every step: once the
    record shows the stranger contradicting, the replica steps on its update alone (it is not
    frozen by ties, as it would be if the stranger kept its vote)."""
    blocks, reps = replicas(tiny_config, 2, DeMoConfig())
    voters = []
    for step in range(12):
        payloads = []
        for index, (block, replica) in enumerate(zip(blocks, reps)):
            backward(block, tiny_windows, seed=1000 * index + step)
            payloads.append(replica.make_payload(lr=2e-3))
        payloads[1] = negate(payloads[1])
        replica = reps[0]
        gathered = senders(decode_payload(encode_payload(p, 16), replica) for p in payloads)
        if step < 11:
            voters.append(replica.apply(gathered, "r0"))
    last_voters, steps = directions(replica, gathered)
    assert last_voters == ["r0"], voters
    for name in replica.params:  # the last step: its own update, everywhere
        own = decompress(gathered[0][1][name])
        torch.testing.assert_close(steps[name], unit_rms(own), rtol=1e-5, atol=1e-6, msg=name)


def distance(a, b) -> float:
    """The distance between two lists of tensors, as one vector."""
    return math.sqrt(sum(float((x - y).detach().pow(2).sum()) for x, y in zip(a, b)))


@pytest.mark.parametrize(("stranger", "value_bits"), [("zero values", 16), ("zero values", 1), ("no parameter", 16)])
def test_of_two_senders_a_stranger_that_would_freeze_the_replica_leaves_and_it_trains_as_alone(
    tiny_config, tiny_windows, stranger, value_bits
):
    """One replica beside a stranger whose payload keeps nothing of its update: coefficients of
    value 0 where the replica sends its own, or no parameter at all. It shares no nonzero
    coefficient with the replica, so the sign record never fills, and under unanimity the
    replica would move by its weight decay alone; the record of the share its step keeps drops
    the stranger, and the replica moves as a twin of it that trains alone on the same data."""
    demo = DeMoConfig(value_bits=value_bits)
    voters, blocks, start = beside_a_twin_alone(tiny_config, tiny_windows, demo, FREE_KEYS[stranger], strangers=1)
    assert voters[-1] == ["r0"]
    moved = distance(blocks[1].parameters(), start)
    decay_alone = (1 - (1 - demo.step_lr * demo.weight_decay) ** 10) * distance(start, [0 * p for p in start])
    assert moved > 10 * decay_alone  # the twin's steps are worth stopping
    assert distance(blocks[0].parameters(), blocks[1].parameters()) <= 0.01 * moved


def beside_a_twin_alone(config, windows, demo: DeMoConfig, send, strangers: int) -> tuple[list, list, list]:
    """Ten steps of a replica beside `strangers` that each send `send` of its payload, and of its twin
    alone on the same data: the voters of each step, both blocks (the replica's first), the start."""
    blocks, (beside, alone) = replicas(config, 2, demo)
    start = [p.detach().clone() for p in blocks[0].parameters()]
    voters = []
    for step in range(10):
        own = []
        for block, replica in zip(blocks, (beside, alone)):
            backward(block, windows, seed=step)  # the same data: the twin's update is the replica's
            own.append(decode_payload(encode_payload(replica.make_payload(lr=2e-3), demo.value_bits), replica))
        sent = decode_payload(encode_payload(send(own[0]), demo.value_bits), beside)
        voters.append(beside.apply([*[(f"k{i}", sent) for i in range(strangers)], ("r0", own[0])], "r0"))
        alone.apply([("r0", own[1])], "r0")
    return voters, blocks, start


FREE_KEYS = {  # what two free keys send a lone replica, from its own payload (they can fetch it)
    "zero values": lambda own: {n: dataclasses.replace(c, values=torch.zeros_like(c.values)) for n, c in own.items()},
    "no parameter": lambda own: {},
    "negated": lambda own: {n: dataclasses.replace(c, values=(-c.values.float()).to(c.values.dtype))
                            for n, c in own.items()},  # fmt: skip
    "largest signs flipped": lambda own: {n: dataclasses.replace(c, values=largest_flipped(c.values, 0.45))
                                          for n, c in own.items()},  # fmt: skip
}


def largest_flipped(values: torch.Tensor, share: float) -> torch.Tensor:
    """`values` with the signs of the largest `share` of them flipped: their agreeing minimum with
    the originals keeps the small ones, while most of their size goes the other way."""
    flat = values.float().flatten().clone()
    flat[flat.abs().argsort(descending=True)[: int(share * flat.numel())]] *= -1
    return flat.view_as(values).to(values.dtype)


@pytest.mark.parametrize("keys", list(FREE_KEYS))
def test_of_three_senders_two_free_keys_neither_freeze_nor_reverse_a_lone_replica(tiny_config, tiny_windows, keys):
    """Issue 57: a lone replica beside two free keys that send a payload decoding to zero (no
    fetch needed), or its own payload negated, or with the signs of its largest 45% of values
    flipped. The two were a majority of its vote: nothing, the median of its update and two zeros,
    moved it but weight decay; negated, they contradicted it out of the vote and stepped it up its
    loss; flipped, the sign record kept them (most shared signs agree) and the step went against
    its update. Now a vote that keeps no more than `kept_at` of its update (own in it or not;
    `Evidence.keeps_own`: of its sizes, or in its direction) is set aside: it moves as a twin of
    it that trains alone on the same data."""
    voters, blocks, start = beside_a_twin_alone(tiny_config, tiny_windows, DeMoConfig(), FREE_KEYS[keys], strangers=2)
    assert voters == [["r0"]] * 10, voters
    moved = distance(blocks[1].parameters(), start)
    assert distance(blocks[0].parameters(), blocks[1].parameters()) <= 0.01 * moved


def test_of_two_senders_the_other_moves_no_coordinate_this_one_does_not(tiny_config, tiny_windows):
    """Before any evidence, a stranger beside one replica: a coordinate moves only where both
    voted the same way; where this replica is silent (here a whole parameter it has no gradient
    for) or opposed, nothing moves, whatever the stranger sends within the wire's limits."""
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig())
    backward(blocks[0], tiny_windows, 0)
    own = replica.make_payload(lr=2e-3)
    silent = next(iter(own))
    del own[silent]
    largest = 0.95 * replica.max_value
    backward(blocks[0], tiny_windows, 1)
    hostile = {
        n: dataclasses.replace(c, values=(torch.randint(0, 2, c.values.shape) * 2 - 1).to(c.values.dtype) * largest)
        for n, c in replica.make_payload(lr=2e-3).items()
    }
    gathered = senders(decode_payload(encode_payload(p, 16), replica) for p in (own, hostile))
    voters, steps = directions(replica, gathered)
    assert voters == ["r0", "r1"]  # no evidence yet: both vote
    for name, param in replica.params.items():
        moved = steps[name].sign()
        mine = decompress(gathered[0][1][name]).sign() if name in own else torch.zeros_like(param)
        theirs = decompress(gathered[1][1][name]).sign()
        assert torch.equal(moved, torch.where(mine == theirs, mine, 0.0)), name


def dense_agreed_and_shared(optimizer, a, b) -> tuple[int, int]:
    """The reference count: both payloads' signs laid out over every parameter (0: not sent),
    compared coordinate by coordinate."""

    def signs(payload):
        parts = []
        for name, param in optimizer.params.items():
            dense = torch.zeros(param.numel(), dtype=torch.int8)
            if name in payload:
                sent = payload[name]
                signs = sent.values.float().sign().to(torch.int8)
                dense.view(sent.indices.shape[0], -1).scatter_(1, sent.indices, signs)
            parts.append(dense)
        return torch.cat(parts)

    signs_a, signs_b = signs(a), signs(b)
    both = (signs_a != 0) & (signs_b != 0)
    return int(((signs_a == signs_b) & both).sum()), int(both.sum())


def random_payload(template, generator, overlapping=None):
    """A payload of `template`'s shapes with random sorted indices (half of the tiles taking
    `overlapping`'s where given, so that payloads share coefficients) and random values, a few
    of them zero; about one parameter in five left out."""
    payload = {}
    for name, sent in template.items():
        if torch.rand((), generator=generator) < 0.2:
            continue
        tiles, k = sent.indices.shape
        shuffled = torch.rand(tiles, sent.tile[0] * sent.tile[1], generator=generator).argsort(dim=1)
        indices = shuffled[:, :k].sort(dim=1).values
        if overlapping is not None and name in overlapping:
            taken = torch.rand(tiles, generator=generator) < 0.5
            indices[taken] = overlapping[name].indices[taken]
        values = torch.randint(-1, 2, (tiles, k), generator=generator) * 1e-5
        payload[name] = dataclasses.replace(sent, indices=indices, values=values.to(torch.bfloat16))
    return payload


def test_counts_on_the_sent_coefficients_equal_the_dense_comparison(tiny_config, tiny_windows):
    """`trusted` compares payloads on the coefficients they sent; its counts are those of the
    comparison laid out over every parameter, for every pair, added to the decayed record."""
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig())
    backward(blocks[0], tiny_windows, 0)
    template = replica.make_payload(lr=2e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        first = random_payload(template, generator)
        payloads = [first] + [random_payload(template, generator, overlapping=first) for _ in range(3)]
        before = dict(replica.evidence.record)
        _, record = replica.trusted(senders(payloads), "r0")
        for i, j in itertools.combinations(range(len(payloads)), 2):
            agreed, shared = dense_agreed_and_shared(replica, payloads[i], payloads[j])
            old_agreed, old_shared = before.get((f"r{i}", f"r{j}"), (0.0, 0.0))
            decay = replica.config.evidence_decay
            assert shared > 0 and agreed < shared  # the payloads overlap, and disagree somewhere
            assert record[(f"r{i}", f"r{j}")] == (old_agreed * decay + agreed, old_shared * decay + shared)
        replica.evidence.record = record


def test_the_step_follows_the_schedule_of_the_payload_it_was_made_with(tiny_config, tiny_windows):
    """Made at half the peak learning rate, the same update moves every weight half as far."""
    blocks, reps = replicas(tiny_config, 2, DeMoConfig())
    before = [p.detach().clone() for p in blocks[0].parameters()]
    for block, replica, lr in zip(blocks, reps, (2e-3, 1e-3)):
        backward(block, tiny_windows, 0)
        replica.apply(senders([replica.make_payload(lr=lr)]), "r0")
    assert reps[1].rate == reps[0].rate / 2 == DeMoConfig().step_lr / 2
    for start, full, half in zip(before, blocks[0].parameters(), blocks[1].parameters()):
        torch.testing.assert_close(start - half.detach(), (start - full.detach()) / 2, rtol=1e-3, atol=1e-7)


def one_tile_like(own: dict, name: str) -> dict:
    """A stranger's payload that is `own` but sends, of `name`, only the tile where `own`'s update
    is smallest without being zero (zero values elsewhere: no sign to contradict, and an agreeing
    minimum of zero there): the tile the scaling would enlarge the most."""
    sent = own[name]
    energy = sent.values.float().pow(2).sum(dim=1)
    tile = int(torch.where(energy > 0, energy, math.inf).argmin())
    values = torch.zeros_like(sent.values)
    values[tile] = sent.values[tile]
    return {**own, name: dataclasses.replace(sent, values=values)}


def test_of_two_senders_a_stranger_that_agrees_on_one_tile_alone_moves_it_at_most_4x_as_far(
    tiny_config, tiny_windows, monkeypatch
):
    """A stranger beside one replica sends its update, but on one parameter only that update's
    weakest tile: the combined update is that tile alone, and scaled to an RMS of 1 over the parameter
    it would move that tile's weights many times as far as the replica's own update says. The
    floor (`STEP_RMS_FLOOR`) bounds it at 4x; without it the bound fails."""
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig())
    backward(blocks[0], tiny_windows, 0)
    own = decode_payload(encode_payload(replica.make_payload(lr=2e-3), 16), replica)
    name = max(own, key=lambda n: own[n].indices.shape[0])  # the parameter of the most tiles
    stranger = one_tile_like(own, name)

    def largest_gain() -> float:
        _, steps = directions(copy.deepcopy(replica), senders([own, stranger]))
        own_unit = unit_rms(decompress(own[name]))
        moved = steps[name].abs()
        return float((moved / own_unit.abs().clamp_min(1e-12))[moved > 0].max())

    assert largest_gain() <= 1 / decoupled_momentum.STEP_RMS_FLOOR + 1e-4
    monkeypatch.setattr(decoupled_momentum, "STEP_RMS_FLOOR", 1e-12)
    assert largest_gain() > 1 / 0.25


def test_values_too_small_to_square_in_float32_still_weigh_one_voice(tiny_config, tiny_windows):
    """A payload of values around 1e-20 (the wire bounds values from above only): scaled to an
    update of RMS 1 all the same, not blown up by a square that underflows."""
    blocks, (replica,) = replicas(tiny_config, 1, DeMoConfig())
    backward(blocks[0], tiny_windows, 0)
    sent = next(iter(replica.make_payload(lr=2e-3).values()))
    tiny = dataclasses.replace(sent, values=(sent.values.float().sign() * 1e-20).to(sent.values.dtype))
    scaled = dataclasses.replace(tiny, values=decoupled_momentum.unit_values(tiny, torch.float32))
    assert math.isclose(float(decompress(scaled).pow(2).mean().sqrt()), 1.0, rel_tol=1e-3)
