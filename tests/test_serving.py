"""Generation through real peer processes: equal to local generation, failover, refusals."""

from __future__ import annotations

import asyncio
import signal

import pytest
import torch
from hivemind.compression import serialize_torch_tensor
from hivemind.p2p import PeerID
from hivemind.proto import runtime_pb2
from swarm_helpers import FAST_PEER, tiny_swarm, wait_for

from swarm.checkpoints.choice import SpotCheck
from swarm.model.checkpoint import load_model_folder
from swarm.model.families import family_of, generate_span, local_runner
from swarm.model.generate import continue_text, prefix_tensor
from swarm.model.steps import Sampling
from swarm.p2p.limits import MAX_REQUEST_BYTES
from swarm.p2p.messages import DenoiseRequest, refusal
from swarm.serving.remote import RemoteBlocks
from swarm.serving.server import DenoiseServicer
from swarm.serving.wire import MAX_BATCH

MASK_ID = 256  # the mask unit of the tests' byte models (ModelConfig.mask_id)

SWARM = "servetest"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Block 0 on peer a; block 1 on b1 and on b2, which starts from b1's checkpoint (same weights)."""
    with tiny_swarm(tmp_path_factory.mktemp("serve"), SWARM, {"a": "0", "b1": "1"}) as (local, peers, client):
        peers["b2"] = local.start_peer("b2", "1", FAST_PEER)
        wait_for(lambda: sum(h.announcement.state == "serving" for h in client.directory.hosts(1)) == 2, 60, "b2")
        fetched = local.run("swarm-fetch", "--out", "model")
        assert fetched.returncode == 0, fetched.stderr
        yield local, peers, client, load_model_folder(local.workdir / "model")


def remote_runner(served_fixture, **options) -> RemoteBlocks:
    local, _, client, model = served_fixture
    spot_check = SpotCheck.from_source(local.data, model.config)  # measures the checkpoints it uses
    return RemoteBlocks(client.directory, client.p2p, client.loop, model.config, request_timeout=10, ban_seconds=120,
                        spot_check=spot_check, **options)  # fmt: skip


def test_distributed_generation_equals_local_generation(served):
    local_swarm, _, _, model = served
    prefix = prefix_tensor(b"The quick brown", model.config)
    remote = generate_span(remote_runner(served), model.config, prefix, 3, torch.Generator().manual_seed(5))
    here = generate_span(local_runner(model.denoiser_for_block, model.config), model.config, prefix, 3,
                         torch.Generator().manual_seed(5))
    assert torch.equal(remote[0], here[0])
    # the reveal order travels in the request: asked for another order, the peers write what it writes
    # here (confident order ranks by the logits, so the peers' and this process's must rank alike)
    for order in ("random", "confident"):
        sampling = Sampling(reveal=order)
        remote_other = generate_span(remote_runner(served), model.config, prefix, 3, torch.Generator().manual_seed(5),
                                     sampling)[0]  # fmt: skip
        here_other = generate_span(local_runner(model.denoiser_for_block, model.config), model.config, prefix, 3,
                                   torch.Generator().manual_seed(5), sampling)[0]  # fmt: skip
        assert torch.equal(remote_other, here_other), order
        if order == "random":
            assert not torch.equal(here_other, here[0])  # else this would not tell whether the order travelled
    # a remote pass asks only the last block for logits: those of the bytes it revealed
    from_last_block = remote[1].abs().sum(dim=-1) > 0
    assert from_last_block.any()
    assert torch.allclose(remote[1][from_last_block], here[1][from_last_block], atol=1e-4)

    expected = b"".join(continue_text(local_runner(model.denoiser_for_block, model.config), model.config,
                                      b"The quick brown", 20, steps_per_block=2, seed=9))
    # stdout read as text
    written = expected.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    for sure_of in ([], ["--run-block", "1"]):  # block 1 asked of its hosts, or run here
        result = local_swarm.run("swarm-generate", "--max-bytes", "20", "--steps-per-block", "2", "--seed", "9",
                                 "--data", local_swarm.data, *sure_of, "The quick brown")  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.rstrip("\n") == written, sure_of


def test_what_confirming_every_answer_costs(served):
    """Block 1's checkpoint has two keys: each answer costs a second request, to the other key.
    Block 0's has one: no request more. Keys are free in this open swarm, so each block's checkpoint
    is measured once (downloaded and spot-checked) before it is used, and a share of the answers used
    (`AUDIT_RATE`), block 1's that both keys agree on as block 0's, is computed here all the same
    (`lone_checked`): nothing else is."""
    _, _, _, model = served
    runner, spans = remote_runner(served), 4
    text = b"".join(continue_text(runner, model.config, b"Counting", spans * model.config.gen_len, 2, seed=4))
    assert len(text) == spans * model.config.gen_len
    assert runner.round_trips == spans * model.config.n_blocks
    assert runner.checks.extra_requests == runner.checks.requests_checked == spans  # one per span: block 1's
    assert runner.checks.disagreements == 0, runner.checks
    assert runner.checks.checkpoints_measured == model.config.n_blocks, runner.checks
    assert runner.checks.computed_here == runner.checks.lone_checked, runner.checks


@pytest.mark.parametrize("run_here", [{1}, {0, 1}], ids=["block 1 here", "every block here"])
def test_what_running_a_block_here_costs(served, run_here):
    """A client that must be sure of a block runs it itself (`RemoteBlocks.run_here`,
    `swarm-generate --run-block`): the same text, no request to any host of it (no witness either),
    and its steps computed here for every span, from its checkpoint's file, downloaded once (the
    measurement's). Over 4 spans of this 2-block swarm: asking both blocks costs 8 requests, 4 to
    witnesses, and about a quarter of the 8 answers computed here (the audit); running block 1 here,
    4 requests, no witness, its 4 answers and about a quarter of block 0's computed here; running
    both, no request and all 8 computed here."""
    _, _, _, model = served
    runner, spans = remote_runner(served, run_here=frozenset(run_here)), 4
    length = spans * model.config.gen_len
    text = b"".join(continue_text(runner, model.config, b"Counting", length, 2, seed=4))
    assert text == b"".join(continue_text(local_runner(model.denoiser_for_block, model.config), model.config,
                                          b"Counting", length, 2, seed=4))  # fmt: skip
    asked = model.config.n_blocks - len(run_here)
    assert runner.round_trips == spans * asked, runner.checks
    assert runner.checks.extra_requests == runner.checks.requests_checked == 0, runner.checks  # block 0 is lone
    assert runner.checks.computed_here - runner.checks.lone_checked == spans * len(run_here), runner.checks
    assert runner.checks.checkpoints_measured == model.config.n_blocks, runner.checks


def test_generation_survives_a_replica_killed_midway(served):
    local_swarm, peers, _, model = served
    runner = remote_runner(served)
    spans = continue_text(runner, model.config, b"Swarm", 40, steps_per_block=1, seed=1)
    first = next(spans)
    victim = runner.choose(1).announcement.public_name  # the replica the first span went through
    local_swarm.stop(peers[victim], signal.SIGKILL)
    text = first + b"".join(spans)
    expected = b"".join(continue_text(local_runner(model.denoiser_for_block, model.config), model.config,
                                      b"Swarm", 40, steps_per_block=1, seed=1))
    assert text == expected
    assert runner.choose(1).announcement.public_name != victim


def denoise_request(block: int, tensors: list[torch.Tensor]) -> runtime_pb2.ExpertRequest:
    return runtime_pb2.ExpertRequest(
        metadata=DenoiseRequest(block=block).encode(), tensors=[serialize_torch_tensor(t) for t in tensors]
    )


def denoise_call(served, block: int, tensors: list[torch.Tensor]):
    """Send a hand-made denoise request to peer a (block 0): the reply, or the refusal's text."""
    client = served[2]
    host = next(h for h in client.directory.hosts(0) if h.announcement.public_name == "a")
    stub = DenoiseServicer.get_stub(client.p2p, PeerID.from_base58(host.peer_id))
    response = client.run(stub.rpc_denoise(denoise_request(block, tensors), timeout=10), 15)
    return refusal(response) or response


def test_malformed_requests_are_refused_and_the_peer_keeps_serving(served):
    config = served[3].config
    n, p, g = 2, config.prefix_len, config.gen_len
    hidden = torch.full((n, g), MASK_ID, dtype=torch.long)
    good = [torch.zeros(n, p, dtype=torch.long), hidden, family_of(config).schedule(0, 2)]
    above_one = good[2].clone()
    above_one[0] = 1.5
    bad_requests = {
        "wrong block": (1, good),
        "wrong state shape": (0, [good[0], torch.full((n, g + 1), MASK_ID), good[2]]),
        "float state": (0, [good[0], hidden.float(), good[2]]),
        "not a byte or the mask": (0, [good[0], hidden + 1, good[2]]),
        "absurd batch": (0, [torch.zeros(MAX_BATCH + 1, p, dtype=torch.long),
                             torch.full((MAX_BATCH + 1, g), MASK_ID), good[2]]),  # fmt: skip
        "rising mask rates": (0, [good[0], good[1], good[2].flip(0)]),
        "mask rate above 1": (0, [good[0], good[1], above_one]),
        "NaN mask rate": (0, [good[0], good[1], torch.tensor([float("nan"), 0.5])]),
        "prefix not bytes": (0, [good[0] + 300, good[1], good[2]]),
        "missing tensor": (0, good[:2]),
        "oversized": (0, [good[0], hidden, good[2], torch.zeros(MAX_REQUEST_BYTES // 4 + 1)]),
    }
    for name, (block, tensors) in bad_requests.items():
        reply = denoise_call(served, block, tensors)
        assert isinstance(reply, str), name
        if name == "oversized":
            assert "over the limit" in reply
    reply = denoise_call(served, 0, good)
    assert not isinstance(reply, str) and len(reply.tensors) == 1


def test_a_flood_from_one_peer_is_refused_beyond_its_share(served):
    config = served[3].config
    n, p, g = MAX_BATCH, config.prefix_len, config.gen_len
    heavy = [torch.zeros(n, p, dtype=torch.long), torch.full((n, g), MASK_ID), family_of(config).schedule(0, 48)]
    client = served[2]
    host = next(h for h in client.directory.hosts(0) if h.announcement.public_name == "a")
    stub = DenoiseServicer.get_stub(client.p2p, PeerID.from_base58(host.peer_id))
    request = denoise_request(0, heavy)

    async def flood(count: int):
        return await asyncio.gather(*(stub.rpc_denoise(request, timeout=60) for _ in range(count)))

    replies = client.run(flood(24), 120)
    busy = [r for r in replies if "busy" in (refusal(r) or "")]
    answered = [r for r in replies if not r.metadata]
    assert busy and answered and len(busy) + len(answered) == len(replies)
    assert len(answered) <= len(replies) // 2  # most of the flood was turned away, not queued
    assert not isinstance(denoise_call(served, 0, heavy[:2] + [heavy[2][:3]]), str)  # and it still serves
