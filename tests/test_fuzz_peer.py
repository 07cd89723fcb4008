"""The P2P handlers of live peers, fuzzed: every handler answers any message with a reply (an error
reply for one it refuses) within its timeout, never raises, and its peer answers the next valid
request.

Two real `swarm-peer` processes and a bootstrap on 127.0.0.1 (swarm/lab/fuzz_peers.py's
`fuzz_swarm`: a small model of the built-in tokenizer, one peer per block, each also serving its
stage of the autoregressive pipeline, so that every handler of ours is live). hypothesis draws
raw messages for each handler: random bytes, the valid request's bytes mutated, its metadata's
fields set to any value, and for those that carry tensors, tensors whose fields lie. Stream
messages are sent whole (a stream cut short is answered when the host's wait for the rest ends,
`FIRST_BYTE_TIMEOUT_S` later; benchmarks/fuzz.py sends those). benchmarks/fuzz.py sends 100,000.
"""

from __future__ import annotations

import msgpack
import pytest
from fuzz_strategies import mutated, with_field
from google.protobuf.message import DecodeError
from hivemind.proto import runtime_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.checkpoints.transfer import DOWNLOAD, BlockServicer
from swarm.lab.fuzz_peers import ANSWER, ERROR_REPLY, Handler, answers, frames, fuzz_swarm, send
from swarm.lab.mutations import DTYPES
from swarm.p2p.info import InfoServicer
from swarm.p2p.messages import DenoiseRequest
from swarm.p2p.reachability import ReachabilityServicer
from swarm.p2p.tokenizer import TokenizerServicer
from swarm.serving.ar_pipeline import StageServicer
from swarm.serving.server import DenoiseServicer
from swarm.sync.transport import PayloadServicer

SERVICERS = (InfoServicer, BlockServicer, PayloadServicer, DenoiseServicer, StageServicer, TokenizerServicer,
             ReachabilityServicer)  # fmt: skip
HANDLED = sorted({name for servicer in SERVICERS for name in vars(servicer) if name.startswith("rpc_")} | {DOWNLOAD})
CALL_SLACK_S = 5.0  # the event loop's own margin beyond a handler's timeout


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with fuzz_swarm(tmp_path_factory.mktemp("fuzz_peer")) as started:
        yield started


def handler_of(targets, name: str, which: int) -> tuple[str, Handler]:
    target = targets[which % len(targets)]
    return target.host.peer_id, next(h for h in target.handlers if h.name == name)


@st.composite
def message_for(draw: st.DrawFn, handler: Handler) -> bytes:
    """Raw bytes for `handler`: random, its valid request mutated as bytes, as fields, or in its tensors."""
    request = handler.request
    kinds = ["random", "bytes"] + (["fields"] if hasattr(request, "metadata") else [])
    kinds += ["tensors"] if getattr(request, "tensors", None) else []
    kind = draw(st.sampled_from(kinds))
    if kind == "random":
        return draw(st.binary(max_size=2048))
    if kind == "bytes":  # a stream's bytes cut short or with a length changed would wait for the rest
        return draw(
            mutated(handler.sample(), ("extension", "huge length prefix"))
            if handler.stream
            else mutated(handler.sample())
        )
    changed = type(request)()
    changed.CopyFrom(request)
    if kind == "fields":
        try:
            changed.metadata = msgpack.packb(with_field(draw, msgpack.unpackb(request.metadata)), use_bin_type=True)
        except (ValueError, TypeError, OverflowError):  # a value msgpack cannot write cannot be sent either
            pass
    else:
        tensor = changed.tensors[draw(st.integers(0, len(changed.tensors) - 1))]
        tensor.dtype = draw(st.one_of(st.sampled_from(DTYPES), st.text(max_size=8)))
        del tensor.size[:]
        tensor.size.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=4)))
        tensor.buffer = draw(st.one_of(st.just(tensor.buffer), st.binary(max_size=256)))
    return frames(changed.SerializeToString()) if handler.stream else changed.SerializeToString()


def test_every_handler_of_a_peer_is_fuzzed(swarm):
    _, _, targets = swarm
    for target in targets:
        assert sorted(h.name for h in target.handlers) == HANDLED


@pytest.mark.parametrize("name", HANDLED)
def test_a_handler_answers_its_valid_request(swarm, name):
    """The fuzzing starts from requests each handler answers (or refuses, in its schema) as a peer would."""
    _, client, targets = swarm
    peer_id, handler = handler_of(targets, name, 0)
    outcome, why = client.loop.run(
        send(client.p2p, peer_id, handler, handler.sample()), handler.timeout_s + CALL_SLACK_S
    )
    assert outcome in (ANSWER, ERROR_REPLY), f"{name}: {outcome}: {why}"
    if name in ("rpc_info", "rpc_denoise", "rpc_stage", "rpc_tokenizer", "rpc_dial_me", "rpc_chunk_list", DOWNLOAD):
        assert outcome == ANSWER, f"{name} refused a valid request"


def test_a_denoise_request_at_the_smallest_temperature_is_answered(swarm):
    """Found by benchmarks/fuzz.py: a temperature its schema takes (any float in [0, 100]) so small that
    the logits over it overflow made the block's draw raise in the handler (softmax of inf is NaN)."""
    _, client, targets = swarm
    peer_id, handler = handler_of(targets, "rpc_denoise", 0)
    request = runtime_pb2.ExpertRequest()
    request.CopyFrom(handler.request)
    request.metadata = DenoiseRequest(
        **{**DenoiseRequest.decode(request.metadata).model_dump(), "temperature": 1e-45}
    ).encode()
    outcome, why = client.loop.run(
        send(client.p2p, peer_id, handler, request.SerializeToString()), handler.timeout_s + CALL_SLACK_S
    )
    assert outcome == ANSWER, f"{outcome}: {why}"


@pytest.mark.parametrize("name", HANDLED)
@settings(max_examples=25)
@given(draw=st.data())
def test_a_handler_answers_any_message_and_its_peer_answers_on(swarm, name, draw):
    local, client, targets = swarm
    peer_id, handler = handler_of(targets, name, draw.draw(st.integers(0, 1)))
    data = draw.draw(message_for(handler))
    outcome, why = client.loop.run(send(client.p2p, peer_id, handler, data), handler.timeout_s + CALL_SLACK_S)
    assert outcome in (ANSWER, ERROR_REPLY), f"{name}: {outcome}: {why}"
    local.check_running()
    assert client.loop.run(answers(client.p2p, peer_id), 15), f"{name}: the peer no longer answers rpc_info"


def test_raw_envelopes_that_are_not_protobuf_are_refused_by_hivemind(swarm):
    """Bytes that are no envelope never reach a handler: hivemind answers with protobuf's DecodeError."""
    _, client, targets = swarm
    peer_id, handler = handler_of(targets, "rpc_chunk_list", 0)
    garbage = b"\xff" * 64
    with pytest.raises(DecodeError):
        runtime_pb2.ExpertRequest.FromString(garbage)
    outcome, _ = client.loop.run(send(client.p2p, peer_id, handler, garbage), handler.timeout_s + CALL_SLACK_S)
    assert outcome == ERROR_REPLY


def test_the_peers_logs_show_no_handler_that_raised(swarm):
    """Last: after every message above (hivemind logs a stream handler that raised; a unary one's
    exception came back to `send` as RAISED)."""
    _, _, targets = swarm
    for target in targets:
        log = target.process.log()
        assert "Traceback" not in log and "Unhandled exception" not in log, log[-3000:]
