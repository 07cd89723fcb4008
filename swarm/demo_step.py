"""One replica's DeMo update: momentum, the payload it shares, and the sign step on what it gathered.

Per parameter: m = beta * m + lr * grad; the top-k DCT coefficients of m per chunk are taken
out of m (error feedback) and shared; the replica then averages the payloads of every replica
that arrived in time (its own included, decoded in a fixed order so that replicas that gather
the same set compute the same update) and steps p -= sign_lr * (sign(mean) + weight_decay * p).

Payloads cross the network as bytes (`encode_payload` / `decode_payload`); a payload that does
not fit this replica's parameters, or holds NaN, Inf, out-of-range indices or an absurd
norm, is refused with PayloadError and not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack
import numpy as np
import torch
from torch import nn

from swarm.compression import Compressed, decompress, extract, keep_per_chunk, pack_bits, to_chunks, unpack_bits

Payload = dict[str, Compressed]
MAX_VALUE = 1.0  # coefficients of lr * momentum are ~1e-7..1e-5; anything near 1 is hostile


class PayloadError(ValueError):
    """A payload from another replica that must not be applied."""


@dataclass
class DemoConfig:
    """DeMo settings; the defaults follow the study in DESIGN.md (top-k 8, bfloat16, sign rate 2e-3)."""

    top_k: int = 8  # coefficients kept per 64 x 64 tile (scaled with the chunk's size)
    value_bits: int = 16  # 16: bfloat16 values; 1: signs only
    momentum_decay: float = 0.999
    sign_lr: float = 2e-3
    weight_decay: float = 0.01


class DemoReplica:
    """The DeMo state of one replica of a block: a momentum buffer per parameter."""

    def __init__(self, module: nn.Module, config: DemoConfig):
        self.config = config
        self.params = dict(module.named_parameters())
        self.momentum = {name: torch.zeros_like(p) for name, p in self.params.items()}

    def make_payload(self, lr: float) -> Payload:
        """Fold this step's gradients into the momentum and take out what is shared."""
        payload = {}
        for name, param in self.params.items():
            if param.grad is None:
                continue
            self.momentum[name].mul_(self.config.momentum_decay).add_(param.grad, alpha=lr)
            payload[name] = extract(self.momentum[name], self.config.top_k, self.config.value_bits)
        return payload

    @torch.no_grad()
    def apply(self, payloads: list[Payload]) -> None:
        """The sign step on the mean of the gathered payloads (given in a fixed order)."""
        for name, param in self.params.items():
            parts = [decompress(p[name]) for p in payloads if name in p]
            if not parts:
                continue
            mean = torch.stack(parts).mean(dim=0)
            param.mul_(1 - self.config.sign_lr * self.config.weight_decay)
            param.sub_(self.config.sign_lr * mean.sign())


def encode_payload(payload: Payload, value_bits: int) -> bytes:
    """The wire form of a payload: per parameter, indices packed at ceil(log2(tile)) bits and values."""
    entries = {}
    for name, c in payload.items():
        entries[name] = {
            "tile": list(c.tile),
            "count": c.indices.numel(),
            "indices": pack_bits(c.indices, _index_bits(c.tile)),
            "values": _encode_values(c.values, value_bits),
        }
    return msgpack.packb({"value_bits": value_bits, "params": entries})


def decode_payload(data: bytes, replica: DemoReplica) -> Payload:
    """A payload from another replica, checked against this replica's parameters; PayloadError if bad."""
    try:
        message = msgpack.unpackb(data)
        value_bits, entries = message["value_bits"], message["params"]
        return {name: _decode_entry(name, entry, value_bits, replica) for name, entry in entries.items()}
    except PayloadError:
        raise
    except Exception as error:  # truncated, garbage, wrong types
        raise PayloadError(f"malformed payload: {type(error).__name__}") from None


def _decode_entry(name: str, entry: dict, value_bits: int, replica: DemoReplica) -> Compressed:
    if name not in replica.params or value_bits != replica.config.value_bits:
        raise PayloadError(f"unexpected parameter {name!r} or value bits {value_bits}")
    param = replica.params[name]
    chunks, tile = to_chunks(param.detach())
    k = keep_per_chunk(replica.config.top_k, tile[0] * tile[1])
    if tuple(entry["tile"]) != tile or entry["count"] != chunks.shape[0] * k:
        raise PayloadError(f"{name}: shape does not match this block")
    indices = unpack_bits(entry["indices"], _index_bits(tile), entry["count"]).view(-1, k)
    if indices.max() >= tile[0] * tile[1]:
        raise PayloadError(f"{name}: index out of range")
    values = _decode_values(entry["values"], value_bits, indices.shape)
    if not torch.isfinite(values.float()).all() or values.float().abs().max() > MAX_VALUE:
        raise PayloadError(f"{name}: values are not finite or absurdly large")
    return Compressed(param.shape, tile, indices, values)


def _encode_values(values: torch.Tensor, value_bits: int) -> bytes:
    """bfloat16 as raw 16-bit words; 1-bit: sign bits, then one 'empty chunk' bit per chunk."""
    if value_bits != 1:
        return values.view(torch.int16).numpy().tobytes()
    bits = np.concatenate([(values > 0).flatten().numpy(), (values == 0).all(dim=1).numpy()])
    return np.packbits(bits).tobytes()


def _decode_values(data: bytes, value_bits: int, shape: torch.Size) -> torch.Tensor:
    if value_bits != 1:
        return torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy()).view(torch.bfloat16).view(shape)
    bits = torch.from_numpy(np.unpackbits(np.frombuffer(data, dtype=np.uint8)).astype(np.float32))
    count = shape[0] * shape[1]
    signs, empty = bits[:count].view(shape) * 2 - 1, bits[count : count + shape[0]].bool()
    if len(empty) != shape[0]:
        raise PayloadError("1-bit values are truncated")
    return torch.where(empty[:, None], 0.0, signs)


def _index_bits(tile: tuple[int, int]) -> int:
    return max(1, math.ceil(math.log2(tile[0] * tile[1])))
