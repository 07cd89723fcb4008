"""DeMo compression of a momentum tensor: tiled DCT, top-k per tile, error feedback, packing.

The first, network-free piece of replica sync (DESIGN.md, "Replica sync"). Each parameter is
cut into tiles: 2-D (each dimension split by its largest divisor up to 64) for
matrices, runs (1-row tiles) for vectors. Each tile goes through an orthonormal DCT-II, so that what is
sent is exactly what error feedback removes and no coefficient is favoured by scale. The k
largest coefficients of each tile are kept (k scaled with the tile's size against a
64 x 64 tile, at least 1), their indices packed at ceil(log2(tile size)) bits and their
values sent as bfloat16 (float16 underflows at these magnitudes) or as 1-bit signs.

Everything is computed on the tensor's device, in float32 or the tensor's own dtype if wider
(`working_dtype`); only the bits on the wire pass through the CPU.

The DeMo update that uses it is in decoupled_momentum.py, the outer step's in pseudo_gradient.py,
the exchange between replicas in exchange.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import msgpack
import numpy as np
import torch

MAX_TILE_SIDE = 64
REFERENCE_TILE = MAX_TILE_SIDE * MAX_TILE_SIDE


def tile_side(n: int) -> int:
    """The side of a tile along a dimension of n values: the largest divisor of n that is at most 64."""
    return max(d for d in range(1, min(n, MAX_TILE_SIDE) + 1) if n % d == 0)


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of `dtype` is compressed in: at least float32 (a bfloat16 momentum's
    coefficients of 1e-7 would drown in its own rounding), a wider one kept."""
    return torch.promote_types(dtype, torch.float32)


@lru_cache(maxsize=None)
def dct_matrix(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Orthonormal DCT-II matrix (n x n) on `device` in `dtype`: its transpose is its inverse."""
    k = torch.arange(n, dtype=torch.float64, device="cpu")[:, None]
    i = torch.arange(n, dtype=torch.float64, device="cpu")[None, :]
    matrix = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2 / n)
    matrix[0] /= math.sqrt(2)
    return matrix.to(device, dtype)


def to_tiles(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """(n_tiles, rows, cols) tiles of a tensor (a vector gives rows = 1) and the tile shape."""
    matrix = tensor.reshape(1, -1) if tensor.dim() == 1 else tensor.reshape(tensor.shape[0], -1)
    rows, cols = tile_side(matrix.shape[0]), tile_side(matrix.shape[1])
    r, c = matrix.shape[0] // rows, matrix.shape[1] // cols
    return matrix.reshape(r, rows, c, cols).permute(0, 2, 1, 3).reshape(r * c, rows, cols), (rows, cols)


def tiling(shape: torch.Size) -> tuple[int, tuple[int, int]]:
    """(number of tiles, tile shape) of a tensor of `shape`, found on the meta device: no memory
    and no device of its own."""
    tiles, tile = to_tiles(torch.empty(shape, device="meta"))
    return tiles.shape[0], tile


def from_tiles(tiles: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of `to_tiles` for a tensor of `shape`."""
    matrix_shape = (1, math.prod(shape)) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
    _, rows, cols = tiles.shape
    r, c = matrix_shape[0] // rows, matrix_shape[1] // cols
    return tiles.reshape(r, c, rows, cols).permute(0, 2, 1, 3).reshape(shape)


def dct(tiles: torch.Tensor) -> torch.Tensor:
    """2-D DCT-II of every tile (a 1-row tile gets the 1-D transform)."""
    _, rows, cols = tiles.shape
    return dct_matrix(rows, tiles.device, tiles.dtype) @ tiles @ dct_matrix(cols, tiles.device, tiles.dtype).T


def idct(coefficients: torch.Tensor) -> torch.Tensor:
    _, rows, cols = coefficients.shape
    where = coefficients.device, coefficients.dtype
    return dct_matrix(rows, *where).T @ coefficients @ dct_matrix(cols, *where)


def keep_per_tile(top_k: int, tile_elements: int) -> int:
    """Top-k scaled with the tile's size against a 64 x 64 tile, at least 1, at most the tile."""
    return min(tile_elements, max(1, round(top_k * tile_elements / REFERENCE_TILE)))


@dataclass
class Compressed:
    """The top-k DCT coefficients of one tensor: what a replica sends for it."""

    shape: torch.Size
    tile: tuple[int, int]
    indices: torch.Tensor  # (n_tiles, k) int64, positions inside each flattened tile
    values: torch.Tensor  # (n_tiles, k): bfloat16 (16 bits), float32 (32 bits), or +-1 signs (1 bit; 0 for an empty tile)
    position: int = -1  # the parameter's position in its module, when it travels in a payload

    def payload_bytes(self, value_bits: int) -> int:
        """Bytes on the wire: indices at ceil(log2(tile size)) bits, values at value_bits (1-bit
        values add one flag bit per tile)."""
        index_bits = max(1, math.ceil(math.log2(self.tile[0] * self.tile[1])))
        flags = self.indices.shape[0] if value_bits == 1 else 0
        return math.ceil((self.indices.numel() * (index_bits + value_bits) + flags) / 8)


def _top_k(momentum: torch.Tensor, top_k: int) -> tuple[tuple[int, int], torch.Tensor, torch.Tensor]:
    """(tile, indices, values) of the k largest DCT coefficients of each tile, in full precision."""
    tiles, tile = to_tiles(momentum.detach().to(working_dtype(momentum.dtype)))
    coefficients = dct(tiles).flatten(1)
    k = keep_per_tile(top_k, coefficients.shape[1])
    indices = coefficients.abs().topk(k, dim=1).indices.sort(dim=1).values
    return tile, indices, coefficients.gather(1, indices)


def _as_sent(kept: torch.Tensor, value_bits: int) -> torch.Tensor:
    if value_bits not in (1, 16, 32):
        raise ValueError(f"value_bits must be 1, 16 or 32, not {value_bits}")
    return _signs(kept) if value_bits == 1 else kept.to(torch.bfloat16) if value_bits == 16 else kept


def compress(momentum: torch.Tensor, top_k: int, value_bits: int = 16) -> Compressed:
    """Top-k of each tile's DCT, as sent: bfloat16 at 16 bits, signs at 1 bit, float32 at 32 (exact)."""
    tile, indices, kept = _top_k(momentum, top_k)
    return Compressed(momentum.shape, tile, indices, _as_sent(kept, value_bits))


def _signs(kept: torch.Tensor) -> torch.Tensor:
    """+-1 per kept coefficient (0 counts as +); a tile whose kept values are all 0 sends zeros,
    so a parameter with no gradient is not pushed around. On the wire: one flag bit per tile."""
    signs = torch.where(kept >= 0, 1.0, -1.0)
    return torch.where((kept == 0).all(dim=1, keepdim=True), 0.0, signs)


def decompress(compressed: Compressed) -> torch.Tensor:
    """The tensor whose tile DCTs hold exactly the sent coefficients (zeros elsewhere), on the
    device of what was sent, in the working dtype of its values."""
    rows, cols = compressed.tile
    values = compressed.values.to(working_dtype(compressed.values.dtype))
    coefficients = torch.zeros(compressed.indices.shape[0], rows * cols, device=values.device, dtype=values.dtype)
    coefficients.scatter_(1, compressed.indices, values)
    return from_tiles(idct(coefficients.view(-1, rows, cols)), compressed.shape)


def extract(momentum: torch.Tensor, top_k: int, value_bits: int = 16) -> Compressed:
    """Compress the momentum and subtract what is sent from it, in place (error feedback).

    For 1-bit values the sent signs carry no scale, so what is removed is each kept
    coefficient's own value: the momentum forgets exactly the components it shared.
    """
    tile, indices, kept = _top_k(momentum, top_k)
    sent = Compressed(momentum.shape, tile, indices, _as_sent(kept, value_bits))
    removed = sent if value_bits != 1 else Compressed(momentum.shape, tile, indices, kept)
    momentum.sub_(decompress(removed))
    return sent


def to_bits(values: torch.Tensor, bits: int) -> np.ndarray:
    """Non-negative integers below 2**bits as a flat array of their bits (least significant first)."""
    array = values.flatten().cpu().numpy().astype(np.uint64)
    assert (array < (1 << bits)).all(), "value does not fit in the given bits"
    return ((array[:, None] >> np.arange(bits, dtype=np.uint64)) & 1).astype(np.uint8).flatten()


def from_bits(bit_array: np.ndarray, offset: int, bits: int, count: int) -> tuple[torch.Tensor, int]:
    """`count` integers of `bits` bits read at `offset` of a bit array, and the offset after them."""
    end = offset + count * bits
    if end > len(bit_array):
        raise ValueError("bit stream is too short")
    words = bit_array[offset:end].reshape(count, bits).astype(np.int64)
    return torch.from_numpy((words << np.arange(bits, dtype=np.int64)).sum(axis=1)), end


class PayloadError(ValueError):
    """A payload from another replica that must not be applied."""


def index_bits(tile_elements: int) -> int:
    """Bits that one position inside a tile of this many values takes on the wire."""
    return max(1, math.ceil(math.log2(tile_elements)))


def pack_message(header: dict, streams: list[np.ndarray]) -> bytes:
    """A payload on the wire: msgpack of the header's fields and "b", the bit streams packed."""
    packed = np.packbits(np.concatenate(streams)).tobytes() if streams else b""
    return msgpack.packb({**header, "b": packed})


def unpack_message(data: bytes, fields: tuple[str, ...]) -> tuple[list, np.ndarray]:
    """A peer's payload: its header fields' values and its bit array; PayloadError if malformed."""
    try:
        message = msgpack.unpackb(data)
        return [message[name] for name in fields], np.unpackbits(np.frombuffer(message["b"], dtype=np.uint8))
    except Exception as error:  # truncated, garbage, wrong types
        raise PayloadError(f"malformed payload: {type(error).__name__}") from None


def check_fully_read(bit_array: np.ndarray, offset: int) -> None:
    """Only the last byte's padding may follow what was decoded."""
    if len(bit_array) - offset >= 8:
        raise PayloadError("payload has trailing data")
