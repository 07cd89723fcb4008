"""Remote denoising: a peer runs its block's K denoising steps for a client, over hivemind P2P.

Request (`ExpertRequest`): tensors [prefix (N, P) int64 bytes, the span's state, the schedule
(K + 1,) float32 decreasing noise levels], metadata a `DenoiseRequest` (the block, whether to
return logits, the checkpoint the client wants answers from, the seed and temperature of the
block's draws). The state is the family's (swarm/model/families.py): byte ids (N, G) int64 with
the mask id where hidden (masked), or noisy embeddings z (N, G, d) float32 (gaussian).
Reply (`ExpertResponse`): tensors [the state after the K steps, and logits (N, G, vocab_size) float32
if asked], or metadata an `ErrorReply` for a request that is refused. Every request is checked
(shapes, dtypes, sizes, finite values, the block this peer hosts) before any work; the
forward pass runs in a worker thread, on the peer's device (`--device`) in the block's own
dtype, while requests and replies stay CPU tensors in the dtypes above.

A peer serves the checkpoint it announces, not its live training weights: clients choose
a checkpoint by the agreement of its hosts, and replicas that announce the same checkpoint
give the same answers, which a client can check (`swarm.serving.cross_check`). A request
that names another checkpoint is refused.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import OrderedDict

import torch
from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import P2PContext, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.model.denoiser import Denoiser, ModelConfig, build_block
from swarm.model.families import Family, family_of
from swarm.model.steps import Sampling
from swarm.p2p.limits import MAX_REQUEST_BYTES, NOT_A_MEMBER, OPEN, Busy, CallerGate, PerPeerLimit
from swarm.p2p.messages import DenoiseRequest, error_reply

logger = logging.getLogger(__name__)

MAX_BATCH = 64  # windows per request
MAX_STEPS = 64  # denoising steps per request
MAX_CONCURRENT = 4  # requests computed at once; more wait their turn
MAX_PER_PEER = 2  # requests one caller may have in flight (a client sends one at a time)
SERVED_CHECKPOINTS = 2  # the newest checkpoint and the one before


class RequestError(ValueError):
    """A request this peer refuses: the message goes back to the client."""


def check_request(family: Family, config: ModelConfig, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


class DenoiseServicer(ServicerBase):
    """`rpc_denoise`: the block of this peer's announced checkpoint, run on a client's noisy targets."""

    def __init__(self, config: ModelConfig, block: int, gate: CallerGate = OPEN):
        """`gate`: who is answered at all (members only, in a members-only swarm: gate.py)."""
        self.config, self.block, self.gate = config, block, gate
        # sha256 -> a copy of that checkpoint's block ("" for weights never saved), newest last:
        # the previous one stays while records that name it may still be read
        self._served: OrderedDict[str, Denoiser] = OrderedDict()
        self._weights_lock = threading.Lock()
        self.family = family_of(config)
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self.limit = PerPeerLimit(MAX_PER_PEER)

    def swap_in(self, weights: Denoiser, checkpoint: str) -> None:
        """From now on answer with a copy of `weights`, the checkpoint with sha256 `checkpoint`
        (and, for requests that name it, the one served before)."""
        like = next(weights.parameters())
        with torch.device(like.device):  # served where it trained, in its dtype
            copy = build_block(self.config, self.block).to(like.dtype).eval()
        with torch.no_grad():
            copy.load_state_dict(weights.state_dict())
        with self._weights_lock:
            self._served[checkpoint] = copy
            self._served.move_to_end(checkpoint)
            while len(self._served) > SERVED_CHECKPOINTS:
                self._served.popitem(last=False)

    def _denoiser_for(self, checkpoint: str) -> Denoiser:
        with self._weights_lock:
            if not self._served:
                raise RequestError("this peer serves no weights yet")
            if not checkpoint:
                return next(reversed(self._served.values()))
            if checkpoint not in self._served:
                raise RequestError(f"this peer serves checkpoint {next(reversed(self._served))[:12] or '(unsaved)'}, "
                                   f"not {checkpoint[:12]}")  # fmt: skip
            return self._served[checkpoint]

    async def rpc_denoise(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        if not await self.gate.admits(context.remote_id):
            return error_reply(NOT_A_MEMBER)
        try:
            with self.limit.admit(context):
                return await self._denoise(request, context)
        except Busy as error:
            return error_reply(error)

    async def _denoise(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        try:
            if request.ByteSize() > MAX_REQUEST_BYTES:
                raise RequestError(f"request of {request.ByteSize()} bytes is over the limit of {MAX_REQUEST_BYTES}")
            options = DenoiseRequest.decode(request.metadata)
            if options.block != self.block:
                raise RequestError(f"this peer hosts block {self.block}, not {options.block}")
            denoiser = self._denoiser_for(options.checkpoint)
            tensors = [deserialize_torch_tensor(t) for t in request.tensors]
            prefix, state, schedule = check_request(self.family, self.config, tensors)
        except Exception as error:  # anything malformed, whatever the library raised
            logger.info("refused a denoise request from %s: %s", context.remote_id, error)
            return error_reply(error)
        run = functools.partial(self._run, denoiser, prefix, state, schedule, options.seed, options.sampling())
        async with self._slots:
            state, logits = await asyncio.get_running_loop().run_in_executor(None, run)
        outputs = [state] + ([logits.float()] if options.logits else [])
        return runtime_pb2.ExpertResponse(tensors=[serialize_torch_tensor(t) for t in outputs])

    def _run(self, denoiser: Denoiser, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor,
             seed: int, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The block's steps on a checked request: on the block's device, answered on the request's."""
        with torch.no_grad():  # a served copy is never written: `swap_in` replaces it whole
            return self.family.run_steps(denoiser, prefix, state, schedule, seed, sampling)
