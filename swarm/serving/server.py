"""Remote denoising: a peer runs its block's K denoising steps for a client, over hivemind P2P.

Request and reply are wire.py's; every request is checked (size, shapes, dtypes, finite values,
the block this peer hosts) before any work. The forward pass runs in a worker thread, on the
peer's device (`--device`) in the block's own dtype, while requests and replies stay CPU tensors
in the dtypes wire.py names.

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
from hivemind.p2p import P2PContext, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.model.denoiser import Denoiser, ModelConfig, build_block
from swarm.model.families import family_of
from swarm.model.steps import Sampling
from swarm.p2p.limits import NOT_A_MEMBER, OPEN, Busy, CallerGate, PerPeerLimit
from swarm.p2p.messages import error_reply
from swarm.serving.wire import RequestError, check_request, decode_request, encode_reply

logger = logging.getLogger(__name__)

MAX_CONCURRENT = 4  # requests computed at once; more wait their turn
MAX_PER_PEER = 2  # requests one caller may have in flight (a client sends one at a time)
SERVED_CHECKPOINTS = 2  # the newest checkpoint and the one before


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
            options, tensors = decode_request(request)
            if options.block != self.block:
                raise RequestError(f"this peer hosts block {self.block}, not {options.block}")
            denoiser = self._denoiser_for(options.checkpoint)
            prefix, state, schedule = check_request(self.family, self.config, tensors)
        except Exception as error:  # anything malformed, whatever the library raised
            logger.info("refused a denoise request from %s: %s", context.remote_id, error)
            return error_reply(error)
        run = functools.partial(self._run, denoiser, prefix, state, schedule, options.seed, options.sampling())
        async with self._slots:
            state, logits = await asyncio.get_running_loop().run_in_executor(None, run)
        return encode_reply(state, logits if options.logits else None)

    def _run(self, denoiser: Denoiser, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor,
             seed: int, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The block's steps on a checked request: on the block's device, answered on the request's."""
        with torch.no_grad():  # a served copy is never written: `swap_in` replaces it whole
            return self.family.run_steps(denoiser, prefix, state, schedule, seed, sampling)
