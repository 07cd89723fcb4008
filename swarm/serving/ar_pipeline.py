"""The autoregressive pipeline baseline, for the serving benchmark only.

The causal byte transformer is split into B stages of contiguous layers (stage 0 also
embeds, the last stage also has the head), and stage b is served by a peer of block b,
over the same P2P transport as remote denoising. It writes one byte per trip through all
B stages (no KV cache: each trip re-reads the whole context), as Petals-style pipelines of
an autoregressive model must. Latency does not depend on the weights, so a peer serves a
stage of a seeded, untrained model unless given trained ones.

Request: metadata a `StageRequest`, one tensor: bytes (N, T) int64 for stage 0, hidden states
(N, T, d) float32 after. Reply: hidden states, or for the last stage the logits of the
next byte (N, 256); an `ErrorReply` on refusal.
"""

from __future__ import annotations

import asyncio
import logging

import torch
from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2

from swarm.model.autoregressive import ByteTransformer
from swarm.model.denoiser import ModelConfig
from swarm.model.generate import prefix_tensor
from swarm.model.steps import pick_bytes
from swarm.p2p.messages import StageRequest, error_reply, refusal
from swarm.p2p.network import EventLoopThread
from swarm.serving.wire import MAX_BATCH, RequestError

logger = logging.getLogger(__name__)


def stage_layers(n_layers: int, n_stages: int, stage: int) -> range:
    """The layer indices of one stage: contiguous, sizes differing by at most one."""
    bounds = [round(i * n_layers / n_stages) for i in range(n_stages + 1)]
    return range(bounds[stage], bounds[stage + 1])


def run_stage(model: ByteTransformer, stage: int, n_stages: int, x: torch.Tensor) -> torch.Tensor:
    """One stage of the pipeline: bytes or hidden states in, hidden states or next-byte logits out."""
    if stage == 0:
        x = model.embed(x)
    for index in stage_layers(len(model.layers), n_stages, stage):
        x = model.layers[index](x)
    if stage == n_stages - 1:
        return model.logits(x[:, -1])
    return x


def check_stage_input(config: ModelConfig, stage: int, x: torch.Tensor) -> None:
    n, t = (x.shape[0], x.shape[1]) if x.dim() >= 2 else (0, 0)
    if not (1 <= n <= MAX_BATCH and 1 <= t <= config.seq_len):
        raise RequestError(f"batch must be 1..{MAX_BATCH} and length 1..{config.seq_len}")
    if stage == 0:
        if x.dtype != torch.int64 or x.dim() != 2 or x.min() < 0 or x.max() >= config.vocab_size:
            raise RequestError(f"stage 0 takes units: int64 (N, T) in 0..{config.vocab_size - 1}")
    elif x.dtype != torch.float32 or x.shape != (n, t, config.d_model) or not torch.isfinite(x).all():
        raise RequestError(f"stage {stage} takes finite float32 hidden states (N, T, {config.d_model})")


class StageServicer(ServicerBase):
    """`rpc_stage`: one stage of the autoregressive pipeline."""

    def __init__(self, model: ByteTransformer, stage: int, n_stages: int):
        self.model, self.stage, self.n_stages = model.eval(), stage, n_stages

    async def rpc_stage(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        try:
            if StageRequest.decode(request.metadata).stage != self.stage or len(request.tensors) != 1:
                raise RequestError(f"this peer serves stage {self.stage} with one input tensor")
            x = deserialize_torch_tensor(request.tensors[0])
            check_stage_input(self.model.config, self.stage, x)
        except Exception as error:  # a stranger's malformed request, whatever the library raised: refused, not fatal
            return error_reply(error)
        out = await asyncio.get_running_loop().run_in_executor(None, self._run, x)
        return runtime_pb2.ExpertResponse(tensors=[serialize_torch_tensor(out)])

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return run_stage(self.model, self.stage, self.n_stages, x)


def untrained_stage(config: ModelConfig, block: int) -> list[ServicerBase]:
    """The stage a peer of `block` serves for the serving benchmark (`swarm-peer --serve-ar-stage`):
    every peer holds a stage of the same seeded, untrained model."""
    torch.manual_seed(0)
    return [StageServicer(ByteTransformer(config), block, config.n_blocks)]


async def call_stage(p2p: P2P, peer_id: str, stage: int, x: torch.Tensor, timeout: float) -> torch.Tensor:
    stub = StageServicer.get_stub(p2p, PeerID.from_base58(peer_id))
    request = runtime_pb2.ExpertRequest(metadata=StageRequest(stage=stage).encode(),
                                        tensors=[serialize_torch_tensor(x)])
    response = await stub.rpc_stage(request, timeout=timeout)
    if (error := refusal(response)) is not None:
        raise RuntimeError(f"stage {stage} refused: {error}")
    return deserialize_torch_tensor(response.tensors[0])


def generate_autoregressive(
    loop: EventLoopThread, p2p: P2P, stage_peers: list[str], config: ModelConfig, prompt: bytes, length: int,
    timeout: float,
) -> tuple[bytes, int]:
    """Greedy units after `prompt`, one trip through every stage peer per unit: (their bytes, hops)."""
    context, hops = prefix_tensor(prompt, config), 0
    for _ in range(length):
        x = context[:, -config.seq_len :]
        for stage, peer_id in enumerate(stage_peers):
            x = loop.run(call_stage(p2p, peer_id, stage, x, timeout), timeout)
            hops += 1
        context = torch.cat([context, pick_bytes(x, 0.0, torch.Generator())[:, None]], dim=1)
    return config.units().decode(context[0, -length:].tolist()), hops
