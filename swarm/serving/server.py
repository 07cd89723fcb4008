"""Remote denoising: a peer runs its block's K Euler steps for a client, over hivemind P2P.

Request (`ExpertRequest`): tensors [prefix (N, P) int64 bytes, z (N, G, d) float32, sigmas
(K + 1,) float32 decreasing], metadata a `DenoiseRequest` (the block, whether to return logits,
and the checkpoint the client wants answers from).
Reply (`ExpertResponse`): tensors [z after the K steps, and the last logits if asked], or
metadata an `ErrorReply` for a request that is refused. Every request is checked
(shapes, dtypes, sizes, finite values, the block this peer hosts) before any work; the
forward pass runs in a worker thread.

A peer serves the checkpoint it announces, not its live training weights: clients choose
a checkpoint by the agreement of its hosts, and replicas that announce the same checkpoint
give the same answers, which a client can check (`swarm.serving.cross_check`). A request
that names another checkpoint is refused.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict

import torch
from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import P2PContext, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.model.denoiser import VOCAB_SIZE, Denoiser, ModelConfig, build_block
from swarm.model.diffusion import denoise_steps, make_codebook
from swarm.p2p.limits import MAX_REQUEST_BYTES, Busy, PerPeerLimit
from swarm.p2p.messages import DenoiseRequest, error_reply

logger = logging.getLogger(__name__)

MAX_BATCH = 64  # windows per request
MAX_STEPS = 64  # Euler steps per request
MAX_ABS_Z = 1e4
MAX_CONCURRENT = 4  # requests computed at once; more wait their turn
MAX_PER_PEER = 2  # requests one caller may have in flight (a client sends one at a time)
SERVED_CHECKPOINTS = 2  # the newest checkpoint and the one before


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
    """`rpc_denoise`: the block of this peer's announced checkpoint, run on a client's noisy targets."""

    def __init__(self, config: ModelConfig, block: int):
        self.config, self.block = config, block
        # sha256 -> a copy of that checkpoint's block ("" for weights never saved), newest last:
        # the previous one stays while records that name it may still be read
        self._served: OrderedDict[str, Denoiser] = OrderedDict()
        self._weights_lock = threading.Lock()
        self.codebook = make_codebook(config)
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self.limit = PerPeerLimit(MAX_PER_PEER)

    def swap_in(self, weights: Denoiser, checkpoint: str) -> None:
        """From now on answer with a copy of `weights`, the checkpoint with sha256 `checkpoint`
        (and, for requests that name it, the one served before)."""
        copy = build_block(self.config, self.block).eval()
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
            prefix, z, sigmas = check_request(self.config, tensors)
        except Exception as error:  # anything malformed, whatever the library raised
            logger.info("refused a denoise request from %s: %s", context.remote_id, error)
            return error_reply(error)
        async with self._slots:
            z, logits = await asyncio.get_running_loop().run_in_executor(None, self._run, denoiser, prefix, z, sigmas)
        outputs = [z] + ([logits] if options.logits else [])
        return runtime_pb2.ExpertResponse(tensors=[serialize_torch_tensor(t) for t in outputs])

    def _run(self, denoiser: Denoiser, prefix: torch.Tensor, z: torch.Tensor, sigmas: torch.Tensor):
        with torch.no_grad():  # a served copy is never written: `swap_in` replaces it whole
            return denoise_steps(denoiser, self.codebook, prefix, z, sigmas)
