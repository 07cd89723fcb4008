"""The denoise request and reply on the wire (swarm/serving/wire.py), both ends in one process."""

from __future__ import annotations

import pytest
import torch

from swarm.errors import SwarmError
from swarm.model.denoiser import build_block
from swarm.model.families import family_of
from swarm.model.steps import Sampling
from swarm.p2p.limits import MAX_REQUEST_BYTES
from swarm.p2p.messages import DenoiseRequest, error_reply
from swarm.serving.wire import (
    RequestError,
    check_request,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)


def request_of(config, n: int = 2):
    prefix = torch.randint(0, 256, (n, config.prefix_len), dtype=torch.int32)  # sent as int64 whatever it was
    return prefix, torch.full((n, config.gen_len), config.mask_id), family_of(config).schedule(config.n_blocks - 1, 2)


def test_a_request_and_its_reply_cross_the_wire_as_the_server_and_the_client_read_them(tiny_config):
    family, (prefix, state, schedule) = family_of(tiny_config), request_of(tiny_config)
    options = DenoiseRequest(block=1, logits=True, seed=7, temperature=0.5)
    received, tensors = decode_request(encode_request(options, prefix, state, schedule))
    assert received == options
    checked = check_request(family, tiny_config, tensors)
    assert [t.dtype for t in checked] == [torch.int64, torch.int64, torch.float32]
    assert torch.equal(checked[0], prefix.long()) and torch.equal(checked[1], state)
    block = build_block(tiny_config, 1).eval()
    with torch.no_grad():
        answer, logits = family.run_steps(block, *checked, received.seed, Sampling(received.temperature))
    got = decode_reply(family, tiny_config, encode_reply(answer, logits), state, schedule, want_logits=True)
    assert torch.equal(got[0], answer) and torch.equal(got[1], logits.float())
    without = decode_reply(family, tiny_config, encode_reply(answer, None), state, schedule, want_logits=False)
    assert torch.equal(without[0], answer) and without[1] is None


def test_each_end_refuses_what_does_not_fit(tiny_config):
    family, (prefix, state, schedule) = family_of(tiny_config), request_of(tiny_config)
    options = DenoiseRequest(block=0)
    with pytest.raises(RequestError, match="over the limit"):
        decode_request(encode_request(options, prefix, torch.zeros(MAX_REQUEST_BYTES // 4 + 1), schedule))
    with pytest.raises(RequestError, match="expected 3 tensors"):
        check_request(family, tiny_config, [prefix.long(), state])
    with pytest.raises(SwarmError, match="refused: this peer hosts block 1"):
        decode_reply(family, tiny_config, error_reply(ValueError("this peer hosts block 1")), state, schedule, False)
    with pytest.raises(SwarmError, match="malformed reply"):
        decode_reply(family, tiny_config, encode_reply(state[:1], None), state, schedule, False)
    revealed, logits = torch.zeros_like(state), torch.zeros(2, tiny_config.gen_len, 256)  # a fitting answer
    with pytest.raises(SwarmError, match="left bytes hidden"):
        decode_reply(family, tiny_config, encode_reply(state, logits), state, schedule, True)
    with pytest.raises(SwarmError, match="^malformed reply$"):  # logits nobody asked for
        decode_reply(family, tiny_config, encode_reply(revealed, logits), state, schedule, False)
    with pytest.raises(SwarmError, match="malformed logits"):
        decode_reply(family, tiny_config, encode_reply(revealed, logits.fill_(float("nan"))), state, schedule, True)
