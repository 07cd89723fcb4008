"""Every decoder of another peer's bytes, fuzzed: any input is decoded into a value within its bounds
or refused with the decoder's documented error, never another exception, and in bounded time.

swarm/lab/fuzz.py lists the decoders (messages, DHT records as a node and a reader take them, a
block checkpoint, a stream frame, a chunk list, a denoise request and reply, the sync payloads) and
judges each input. Inputs come from hypothesis: random bytes, the decoder's valid sample mutated
(bit flips, truncation, extension, a huge length prefix spliced in), its fields set to values of
any type, and per decoder the inputs its format invites. The suite's hypothesis profile
(conftest.py) derandomizes: the same examples every run. The handlers of live peers are fuzzed in
test_fuzz_peer.py.
"""

from __future__ import annotations

import re

import msgpack
import pytest
import torch
from conftest import TINY
from fuzz_strategies import mutated, values, with_field
from hivemind.compression import serialize_torch_tensor
from hivemind.p2p import P2P
from hivemind.proto import runtime_pb2
from hypothesis import example, given, settings
from hypothesis import strategies as st

from swarm.checkpoints.transfer import REQUEST_BYTES
from swarm.lab.fuzz import ACCEPTED, REFUSED, decoders, judge, with_metadata
from swarm.lab.mutations import DTYPES
from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.families import family_of
from swarm.model.steps import MAX_TEMPERATURE, Sampling
from swarm.p2p.messages import Message
from swarm.p2p.records import SwarmRecordValidator

DECODERS = {decoder.name: decoder for decoder in decoders(ModelConfig(**TINY))}
WITH_FIELDS = [name for name, decoder in DECODERS.items() if decoder.fields is not None]
FAST = settings(max_examples=40)  # per decoder: 29 decoders, three ways each
THOROUGH = settings(max_examples=150)  # one decoder, the inputs its format invites
BLOCK = build_block(ModelConfig(**TINY), TINY["n_blocks"] - 1).eval()  # the last block: its logits reach the draw


def assert_bounded(name: str, data: bytes) -> str:
    verdict = judge(DECODERS[name], data)
    assert verdict in (ACCEPTED, REFUSED), f"{name}: {verdict}"
    return verdict


def test_every_message_and_record_has_a_decoder_fuzzed():
    """A message or record added later is fuzzed too, or this fails."""
    messages = {f"message.{kind.__name__}" for kind in Message.__subclasses__()}
    records = {f"record.{schema.__name__}" for schema in SwarmRecordValidator("x")._schemas.values()}
    assert messages | records <= set(DECODERS)


@pytest.mark.parametrize("name", DECODERS)
def test_a_decoder_accepts_its_valid_sample(name):
    assert judge(DECODERS[name], DECODERS[name].sample) == ACCEPTED


@pytest.mark.parametrize("name", DECODERS)
@FAST
@given(data=st.binary(max_size=4096))
def test_random_bytes_are_decoded_within_bounds_or_refused(name, data):
    assert_bounded(name, data)


@pytest.mark.parametrize("name", DECODERS)
@FAST
@given(draw=st.data())
def test_a_mutated_sample_is_decoded_within_bounds_or_refused(name, draw):
    assert_bounded(name, draw.draw(mutated(DECODERS[name].sample)))


@pytest.mark.parametrize("name", WITH_FIELDS)
@FAST
@given(draw=st.data())
def test_fields_of_any_type_and_size_are_decoded_within_bounds_or_refused(name, draw):
    decoder = DECODERS[name]
    try:
        data = decoder.pack(with_field(draw.draw, decoder.fields))
    except (ValueError, TypeError, OverflowError):  # a value its writer cannot write cannot be sent either
        return
    assert_bounded(name, data)


# --- inputs each format invites ----------------------------------------------------------------------------------


@THOROUGH
@given(step=st.one_of(st.text(max_size=30), st.integers(), st.none(), st.floats(), st.lists(st.integers(), max_size=3)))
@example(step="abc")
@example(step="-5")
@example(step="1_000")
@example(step="9" * 400)
def test_a_checkpoint_holds_a_whole_step_in_range_or_is_refused(step):
    """Its step is metadata text: int() would raise ValueError on "abc", and take "-5" or "1_000"."""
    decoder = DECODERS["checkpoint.decode_block"]
    data = with_metadata(decoder.sample, {**decoder.fields, "step": step})
    if assert_bounded("checkpoint.decode_block", data) == ACCEPTED:
        assert isinstance(step, str) and re.fullmatch("[0-9]{1,15}", step)


@THOROUGH
@given(metadata=st.one_of(st.lists(st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=3), st.integers(),
                          st.text(max_size=10), st.booleans(), st.floats()))  # fmt: skip
def test_a_checkpoint_whose_metadata_is_not_a_map_is_refused(metadata):
    decoder = DECODERS["checkpoint.decode_block"]
    assert judge(decoder, with_metadata(decoder.sample, metadata)) == REFUSED


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_checkpoint_header_nested_deeper_than_a_reader_follows_is_refused(depth):
    header = b"[" * depth + b"]" * depth
    assert judge(DECODERS["checkpoint.decode_block"], len(header).to_bytes(8, "little") + header) == REFUSED


@THOROUGH
@given(present=st.lists(values, max_size=6))
@example(present=[[0]])
@example(present=[{"a": 1}])
@example(present=[0, 0])
def test_a_demo_payload_naming_any_parameters_is_decoded_within_bounds_or_refused(present):
    """A list or map among the parameter positions once raised TypeError (unhashable) out of the
    decoder, past the exchange (which catches PayloadError) and out of the training step."""
    fields = {**DECODERS["sync.demo"].fields, "p": present}
    assert_bounded("sync.demo", msgpack.packb(fields, use_bin_type=True))


@THOROUGH
@given(which=st.integers(0, 2), dtype=st.one_of(st.sampled_from(DTYPES), st.text(max_size=12)),
       size=st.lists(st.integers(0, 2**32 - 1), max_size=5),
       buffer=st.one_of(st.none(), st.binary(max_size=256)),
       compression=st.integers(0, len(runtime_pb2.CompressionType.keys()) - 1),
       requires_grad=st.booleans())  # fmt: skip
@example(which=0, dtype="", size=[2, 16], buffer=None, compression=0, requires_grad=False)
@example(which=0, dtype="int64", size=[2, 16], buffer=b"", compression=0, requires_grad=False)
def test_a_denoise_tensor_whose_fields_lie_is_refused(which, dtype, size, buffer, compression, requires_grad):
    """A serialized tensor's dtype, shape, buffer and codec are a peer's claims: one numpy does not
    know, or a shape its bytes do not fill, once raised TypeError or RuntimeError out of the decoder."""
    for name in ("serving.denoise_request", "serving.denoise_reply"):
        envelope = type(DECODERS[name].envelope)()
        envelope.CopyFrom(DECODERS[name].envelope)
        tensor = envelope.tensors[min(which, len(envelope.tensors) - 1)]
        tensor.dtype, tensor.compression, tensor.requires_grad = dtype, compression, requires_grad
        del tensor.size[:]
        tensor.size.extend(size)
        if buffer is not None:
            tensor.buffer = buffer
        assert_bounded(name, envelope.SerializeToString())


@THOROUGH
@given(metadata=st.one_of(st.binary(max_size=64), st.builds(msgpack.packb, values)))
def test_a_denoise_reply_whose_metadata_is_no_error_reply_is_refused(metadata):
    """The client reads a reply's metadata as a refusal: garbage there once raised MessageError, not
    the SwarmError decode_reply says it raises."""
    envelope = type(DECODERS["serving.denoise_reply"].envelope)()
    envelope.CopyFrom(DECODERS["serving.denoise_reply"].envelope)
    envelope.metadata = metadata
    expected = ACCEPTED if not metadata else REFUSED
    assert judge(DECODERS["serving.denoise_reply"], envelope.SerializeToString()) == expected


@THOROUGH
@given(fill=st.lists(st.one_of(st.floats(), st.integers(-(2**62), 2**62)), min_size=1, max_size=4),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.int64, torch.int32, torch.bool]))  # fmt: skip
def test_denoise_tensors_of_any_values_and_dtype_are_refused_or_within_bounds(fill, dtype):
    """NaN, inf and out-of-range units in the right shape, or the wrong dtype, in each tensor."""
    for name in ("serving.denoise_request", "serving.denoise_reply"):
        envelope = type(DECODERS[name].envelope)()
        envelope.CopyFrom(DECODERS[name].envelope)
        for tensor in envelope.tensors:
            shape = tuple(tensor.size)
            count = torch.Size(shape).numel()
            filled = torch.tensor(fill * -(-count // len(fill)), dtype=torch.float64)[:count]
            tensor.CopyFrom(serialize_torch_tensor(filled.reshape(shape).to(dtype)))
        assert_bounded(name, envelope.SerializeToString())


@THOROUGH
@given(temperature=st.floats(0.0, MAX_TEMPERATURE))
@example(temperature=5e-324)
@example(temperature=1e-45)
def test_a_block_runs_at_any_temperature_a_denoise_request_may_ask(temperature):
    """A request's temperature is any float in [0, MAX_TEMPERATURE]; one so small that the logits over
    it overflow once made the server's draw raise (softmax of inf is NaN: torch.multinomial refuses it)."""
    config = ModelConfig(**TINY)
    family, block = family_of(config), config.n_blocks - 1
    state = torch.full((2, config.gen_len), config.mask_id, dtype=torch.long)
    prefix, schedule = torch.zeros(2, config.prefix_len, dtype=torch.long), family.schedule(block, 2)
    with torch.no_grad():
        answer, _ = family.run_steps(BLOCK, prefix, state, schedule, 0, Sampling(temperature=temperature))
    family.check_answer(state, schedule, answer)
    family.check_state(answer, 2)


@THOROUGH
@given(marker=st.binary(min_size=1, max_size=1), length=st.integers(0, 2**64 - 1), body=st.binary(max_size=64))
@example(marker=P2P.MESSAGE_MARKER, length=2**63, body=b"")
def test_a_stream_frame_announcing_any_length_is_read_within_its_bound(marker, length, body):
    frame = marker + length.to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + body
    if assert_bounded("checkpoint.read_frame", frame) == ACCEPTED:
        assert length <= REQUEST_BYTES and marker in (P2P.MESSAGE_MARKER, P2P.ERROR_MARKER)


@THOROUGH
@given(size=st.integers(-(2**63), 2**64 - 1), hashes=st.binary(max_size=200))
def test_a_chunk_list_of_any_size_describes_its_file_or_is_refused(size, hashes):
    data = msgpack.packb({"size": size, "hashes": hashes}, use_bin_type=True)
    assert_bounded("checkpoint.chunk_list", data)
