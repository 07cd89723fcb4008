"""A denoise request and its reply on the wire, for both ends: the client builds the request and
reads the reply (remote.py), the server reads the request and builds the reply (server.py).

Request (`ExpertRequest`): tensors [prefix (N, P) int64 units, the span's state, the schedule
(K + 1,) float32 decreasing noise levels], metadata a `DenoiseRequest` (swarm/p2p/messages.py:
the block, whether to return logits, the checkpoint the client wants answers from, the seed and
temperature of the block's draws). The state is the family's (swarm/model/families.py): unit ids
(N, G) int64 with the mask id where hidden (masked), or noisy embeddings z (N, G, d) float32
(gaussian).
Reply (`ExpertResponse`): tensors [the state after the K steps, and logits (N, G, vocab_size)
float32 if asked], or metadata an `ErrorReply` for a request that is refused.
Each end checks what it reads before it uses it: the server every request (size, shapes, dtypes,
finite values) before any work, the client every reply (the state's shape and what the steps may
change of it, finite logits of the right shape).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.proto import runtime_pb2

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.model.families import Family
from swarm.p2p.limits import MAX_REQUEST_BYTES
from swarm.p2p.messages import DenoiseRequest, MessageError, refusal
from swarm.serving.cross_check import Answer

MAX_BATCH = 64  # windows per request
MAX_STEPS = 64  # denoising steps per request


class RequestError(ValueError):
    """A request this peer refuses: the message goes back to the client."""


def encode_request(options: DenoiseRequest, prefix: torch.Tensor, state: torch.Tensor,
                   schedule: torch.Tensor) -> runtime_pb2.ExpertRequest:  # fmt: skip
    """The request a client sends: the tensors in the dtypes the server checks, and `options`."""
    tensors = (prefix.long(), state, schedule.float())
    return runtime_pb2.ExpertRequest(tensors=[serialize_torch_tensor(t) for t in tensors], metadata=options.encode())


def decode_request(message: runtime_pb2.ExpertRequest) -> tuple[DenoiseRequest, list[torch.Tensor]]:
    """A request's options and tensors, as sent (`check_request` then checks the tensors);
    RequestError if it is over the size limit or a tensor does not deserialize, MessageError if
    its options do not parse."""
    if message.ByteSize() > MAX_REQUEST_BYTES:
        raise RequestError(f"request of {message.ByteSize()} bytes is over the limit of {MAX_REQUEST_BYTES}")
    return DenoiseRequest.decode(message.metadata), read_tensors(message.tensors, RequestError)


def read_tensors(tensors: Iterable[runtime_pb2.Tensor], error: type[Exception]) -> list[torch.Tensor]:
    """A peer's tensors, deserialized; `error` for one that does not deserialize (a dtype numpy does
    not know, a shape its bytes do not fill, a codec's garbage: hivemind raises what numpy and torch do)."""
    try:
        return [deserialize_torch_tensor(t) for t in tensors]
    except Exception as failure:  # noqa: BLE001 (TypeError, ValueError, RuntimeError, KeyError... on garbage)
        raise error(f"a tensor does not deserialize ({type(failure).__name__}: {str(failure)[:100]})") from None


def check_request(
    family: Family, config: ModelConfig, tensors: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prefix, state, schedule) of a well-formed request for this model; RequestError otherwise."""
    if len(tensors) != 3:
        raise RequestError(f"expected 3 tensors (prefix, state, schedule), got {len(tensors)}")
    prefix, state, schedule = tensors
    n = prefix.shape[0] if prefix.dim() == 2 else -1
    if prefix.dtype != torch.int64 or prefix.shape != (n, config.prefix_len) or not 1 <= n <= MAX_BATCH:
        raise RequestError(f"prefix must be int64 of shape (N <= {MAX_BATCH}, {config.prefix_len})")
    if prefix.min() < 0 or prefix.max() >= config.vocab_size:
        raise RequestError(f"prefix values must be units (0..{config.vocab_size - 1})")
    if schedule.dtype != torch.float32 or schedule.dim() != 1 or not 2 <= len(schedule) <= MAX_STEPS + 1:
        raise RequestError(f"the schedule must be float32 of 2..{MAX_STEPS + 1} noise levels")
    try:
        family.check_state(state, n)
        family.check_schedule(schedule)
    except ValueError as error:
        raise RequestError(str(error)) from None
    return prefix, state, schedule


def encode_reply(state: torch.Tensor, logits: torch.Tensor | None) -> runtime_pb2.ExpertResponse:
    """The server's answer: the state after the steps, and the logits (float32) where asked."""
    outputs = [state] + ([logits.float()] if logits is not None else [])
    return runtime_pb2.ExpertResponse(tensors=[serialize_torch_tensor(t) for t in outputs])


def decode_reply(family: Family, config: ModelConfig, response: runtime_pb2.ExpertResponse, state: torch.Tensor,
                 schedule: torch.Tensor, want_logits: bool) -> Answer:  # fmt: skip
    """The answer in a reply to the request of `state` and `schedule`; SwarmError if the server
    refused it or the reply does not fit the request."""
    try:
        error = refusal(response)
    except MessageError as failure:  # metadata that is no ErrorReply: a reply this client never reads
        raise SwarmError(f"malformed reply: {failure}") from None
    if error is not None:
        raise SwarmError(f"refused: {error}")
    outputs = read_tensors(response.tensors, SwarmError)
    if len(outputs) != 1 + want_logits:
        raise SwarmError("malformed reply")
    try:
        family.check_state(outputs[0], len(state))
        family.check_answer(state, schedule, outputs[0])
    except ValueError as error:
        raise SwarmError(f"malformed reply: {error}") from None
    if want_logits and (
        outputs[1].shape != (*state.shape[:2], config.vocab_size) or not torch.isfinite(outputs[1]).all()
    ):
        raise SwarmError("malformed logits")
    return outputs[0], (outputs[1] if want_logits else None)
