"""Remote denoising: a peer runs its block's K Euler steps for a client, over hivemind P2P.

Request (`ExpertRequest`): tensors [prefix (N, P) int64 bytes, z (N, G, d) float32, sigmas
(K + 1,) float32 decreasing], metadata a `DenoiseRequest` (the block, and whether to return logits).
Reply (`ExpertResponse`): tensors [z after the K steps, and the last logits if asked], or
metadata an `ErrorReply` for a request that is refused. Every request is checked
(shapes, dtypes, sizes, finite values, the block this peer hosts) before any work; the
forward pass runs in a worker thread on a consistent snapshot of the weights.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import torch
from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import P2PContext, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.model.denoiser import VOCAB_SIZE, Denoiser, ModelConfig
from swarm.model.diffusion import denoise_steps, make_codebook
from swarm.p2p.limits import MAX_REQUEST_BYTES, Busy, PerPeerLimit
from swarm.p2p.messages import DenoiseRequest, error_reply

logger = logging.getLogger(__name__)

MAX_BATCH = 64  # windows per request
MAX_STEPS = 64  # Euler steps per request
MAX_ABS_Z = 1e4
MAX_CONCURRENT = 4  # requests computed at once; more wait their turn
MAX_PER_PEER = 2  # requests one caller may have in flight (a client sends one at a time)


class RequestError(ValueError):
    """A request this peer refuses: the message goes back to the client."""


def check_request(config: ModelConfig, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prefix, z, sigmas) of a well-formed request for this model; RequestError otherwise."""
    if len(tensors) != 3:
        raise RequestError(f"expected 3 tensors (prefix, z, sigmas), got {len(tensors)}")
    prefix, z, sigmas = tensors
    n = prefix.shape[0] if prefix.dim() == 2 else -1
    if prefix.dtype != torch.int64 or prefix.shape != (n, config.prefix_len) or not 1 <= n <= MAX_BATCH:
        raise RequestError(f"prefix must be int64 of shape (N <= {MAX_BATCH}, {config.prefix_len})")
    if prefix.min() < 0 or prefix.max() >= VOCAB_SIZE:
        raise RequestError("prefix values must be bytes (0..255)")
    if z.dtype != torch.float32 or z.shape != (n, config.gen_len, config.d_model):
        raise RequestError(f"z must be float32 of shape ({n}, {config.gen_len}, {config.d_model})")
    if not torch.isfinite(z).all() or z.abs().max() > MAX_ABS_Z:
        raise RequestError("z must be finite and of sane magnitude")
    if sigmas.dtype != torch.float32 or sigmas.dim() != 1 or not 2 <= len(sigmas) <= MAX_STEPS + 1:
        raise RequestError(f"sigmas must be float32 of 2..{MAX_STEPS + 1} values")
    if not torch.isfinite(sigmas).all() or (sigmas <= 0).any() or (sigmas[1:] >= sigmas[:-1]).any():
        raise RequestError("sigmas must be finite, positive and decreasing")
    return prefix, z, sigmas


class DenoiseServicer(ServicerBase):
    """`rpc_denoise`: this peer's block, run on a client's noisy targets."""

    def __init__(self, config: ModelConfig, block: int, denoiser: Denoiser, weights_lock: threading.Lock):
        self.config, self.block, self.denoiser, self.weights_lock = config, block, denoiser, weights_lock
        self.codebook = make_codebook(config)
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self.limit = PerPeerLimit(MAX_PER_PEER)

    async def rpc_denoise(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
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
            tensors = [deserialize_torch_tensor(t) for t in request.tensors]
            prefix, z, sigmas = check_request(self.config, tensors)
        except Exception as error:  # anything malformed, whatever the library raised
            logger.info("refused a denoise request from %s: %s", context.remote_id, error)
            return error_reply(error)
        async with self._slots:
            z, logits = await asyncio.get_running_loop().run_in_executor(None, self._run, prefix, z, sigmas)
        outputs = [z] + ([logits] if options.logits else [])
        return runtime_pb2.ExpertResponse(tensors=[serialize_torch_tensor(t) for t in outputs])

    def _run(self, prefix: torch.Tensor, z: torch.Tensor, sigmas: torch.Tensor):
        with torch.no_grad(), self.weights_lock:  # the trainer updates weights only under this lock
            return denoise_steps(self.denoiser, self.codebook, prefix, z, sigmas)
