"""DeMo compression of a momentum: tiled DCT, top-k per tile, error feedback, packing.

The first, network-free piece of replica sync (DESIGN.md, "Replica sync"). Each parameter is
cut into tiles: 2-D (each dimension split by its largest divisor up to 64) for
matrices, runs (1-row tiles) for vectors. Each tile goes through an orthonormal DCT-II, so that what is
sent is exactly what error feedback removes and no coefficient is favoured by scale. The k
largest coefficients of each tile are kept (k scaled with the tile's size against a
64 x 64 tile, at least 1), their indices packed at ceil(log2(tile size)) bits and their
values sent as bfloat16 (float16 underflows at these magnitudes) or as 1-bit signs.

A tensor's coefficients are computed from two large products (`tile_coefficients`): every run
of a tile's width through the column transform at once, then every band of a tile's height
through the row transform. The sender keeps its momentum as these coefficients
(decoupled_momentum.py), so error feedback is zeroing what was sent (`take_top_k`) and needs no
inverse. Everything is computed on the tensor's device, in float32 or the tensor's own dtype if
wider (`working_dtype`); only the bits on the wire pass through the CPU. On the receiving side
the tiles of all the tensors of one tile shape go through each inverse together (`batches`,
`decompress_tiles`): a block has two tile shapes or so, and a call per tensor cost more than the
arithmetic at small sizes. A tile's result does not depend on its neighbours in the batch, so
this changes no bit (tests/test_compression.py checks it).

The DeMo update that uses it is in decoupled_momentum.py, the outer step's in pseudo_gradient.py,
the exchange between replicas in exchange.py.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import cache

import msgpack
import numpy as np
import torch

MAX_TILE_SIDE = 64
REFERENCE_TILE = MAX_TILE_SIDE * MAX_TILE_SIDE
BATCH_ELEMENTS = 1 << 22  # values one transform call takes at most (`batches`): 16 MB in float32
MIN_SHARED_ROWS = 64  # a tensor whose tiles hold fewer rows is transformed alone (`shares_transform`)


def tile_side(n: int) -> int:
    """The side of a tile along a dimension of n values: the largest divisor of n that is at most 64."""
    return max(d for d in range(1, min(n, MAX_TILE_SIDE) + 1) if n % d == 0)


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of `dtype` is compressed in: at least float32 (a bfloat16 momentum's
    coefficients of 1e-7 would drown in its own rounding), a wider one kept."""
    return torch.promote_types(dtype, torch.float32)


@cache
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


@cache
def tiling(shape: torch.Size) -> tuple[int, tuple[int, int]]:
    """(number of tiles, tile shape) of a tensor of `shape`, found on the meta device: no memory
    and no device of its own (and once per shape: it is asked for every parameter of every payload)."""
    tiles, tile = to_tiles(torch.empty(shape, device="meta"))
    return tiles.shape[0], tile


def from_tiles(tiles: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of `to_tiles` for a tensor of `shape`."""
    matrix_shape = (1, math.prod(shape)) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
    _, rows, cols = tiles.shape
    r, c = matrix_shape[0] // rows, matrix_shape[1] // cols
    return tiles.reshape(r, c, rows, cols).permute(0, 2, 1, 3).reshape(shape)


def add_tiles_(tensor: torch.Tensor, tiles: torch.Tensor, alpha: float) -> None:
    """tensor += alpha * from_tiles(tiles, tensor.shape), in place, through a view of the
    (contiguous) tensor as its tiles: no copy of either."""
    _, rows, cols = tiles.shape
    height = 1 if tensor.dim() == 1 else tensor.shape[0]
    width = tensor.numel() // height
    as_tiles = tiles.view(height // rows, width // cols, rows, cols).transpose(1, 2)
    tensor.view(height // rows, rows, width // cols, cols).add_(as_tiles, alpha=alpha)


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
    values: torch.Tensor  # (n_tiles, k): bfloat16 (16 bits), float32 (32), or +-1 signs (1 bit; 0: an empty tile)
    position: int = -1  # the parameter's position in its module, when it travels in a payload

    def payload_bytes(self, value_bits: int) -> int:
        """Bytes on the wire: indices at ceil(log2(tile size)) bits, values at value_bits (1-bit
        values add one flag bit per tile)."""
        index_bits = max(1, math.ceil(math.log2(self.tile[0] * self.tile[1])))
        flags = self.indices.shape[0] if value_bits == 1 else 0
        return math.ceil((self.indices.numel() * (index_bits + value_bits) + flags) / 8)


def shares_transform(n_tiles: int, tile: tuple[int, int], k: int = 0) -> bool:
    """Whether a tensor's tiles may go through a transform beside other tensors' tiles and come
    out with the bits they get alone. A product is computed row by row alike, however many rows it
    has, except when it has few: the BLAS takes another path there (MKL here: under 4 rows with 1
    thread, 12 with 2, 28 with 16), so a tensor whose tiles hold fewer than MIN_SHARED_ROWS rows
    is transformed alone, as it always was. The inverse of one coefficient per tile (`k` 1) is
    one product per value, the same bits on any path; the inverse of a few (`idct_of_kept`) is a
    product per tile, which tests/test_compression.py finds bit for bit the same in a batch."""
    return n_tiles * tile[0] >= MIN_SHARED_ROWS or k == 1


def batches(keys: Sequence[Hashable], sizes: Sequence[int] | None = None) -> list[list[int]]:
    """Positions of tensors grouped for one transform each: same key (tile shape, dtype, device,
    or one of its own where a tensor does not `shares_transform`), in order, at most
    BATCH_ELEMENTS values of `sizes` together if given (a larger tensor is a group of its own).
    It spares a call per tensor, and the bound keeps the temporary tensors small."""
    groups: dict[Hashable, list[list[int]]] = {}
    filled: dict[Hashable, int] = {}
    for position, (key, size) in enumerate(zip(keys, sizes or [0] * len(keys))):
        key_groups = groups.setdefault(key, [[]])
        if key_groups[-1] and filled[key] + size > BATCH_ELEMENTS:
            key_groups.append([])
            filled[key] = 0
        key_groups[-1].append(position)
        filled[key] = filled.get(key, 0) + size
    return [group for key_groups in groups.values() for group in key_groups]


def _as_sent(kept: torch.Tensor, value_bits: int) -> torch.Tensor:
    if value_bits not in (1, 16, 32):
        raise ValueError(f"value_bits must be 1, 16 or 32, not {value_bits}")
    return _signs(kept) if value_bits == 1 else kept.to(torch.bfloat16) if value_bits == 16 else kept


def tile_coefficients(tensor: torch.Tensor) -> torch.Tensor:
    """The DCT coefficients of each tile of a tensor, (n_tiles, rows * cols) in its working dtype:
    `dct` of `to_tiles`, flattened. Computed from two large products instead of two small ones per
    tile: every run of `cols` values through the column transform in one product, then every band
    of `rows` rows through the row transform, and only then cut into tiles (one copy)."""
    n_tiles, (rows, cols) = tiling(tensor.shape)
    where = tensor.device, working_dtype(tensor.dtype)
    height = 1 if tensor.dim() == 1 else tensor.shape[0]
    width = tensor.numel() // height
    runs = tensor.detach().to(where[1]).reshape(-1, cols) @ dct_matrix(cols, *where).T
    bands = runs.view(height // rows, rows, width)
    if rows > 1:
        bands = dct_matrix(rows, *where) @ bands
    return bands.view(height // rows, rows, width // cols, cols).permute(0, 2, 1, 3).reshape(n_tiles, rows * cols)


def take_top_k(coefficients: torch.Tensor, shape: torch.Size, top_k: int, value_bits: int = 16) -> Compressed:
    """The k largest of each tile's coefficients (`tile_coefficients` of a tensor of `shape`), as
    sent, taken out of `coefficients` in place (error feedback): what stays is exactly what was
    not sent, a sent value's bfloat16 rounding included. 1-bit signs carry no scale, so there the
    kept coefficients are zeroed: the momentum forgets exactly the components it shared."""
    k = keep_per_tile(top_k, coefficients.shape[1])
    indices = coefficients.abs().topk(k, dim=1).indices.sort(dim=1).values
    kept = coefficients.gather(1, indices)
    values = _as_sent(kept, value_bits)
    coefficients.scatter_(1, indices, torch.zeros_like(kept) if value_bits == 1 else kept - values.to(kept.dtype))
    return Compressed(shape, tiling(shape)[1], indices, values)


def _signs(kept: torch.Tensor) -> torch.Tensor:
    """+-1 per kept coefficient (0 counts as +); a tile whose kept values are all 0 sends zeros,
    so a parameter with no gradient is not pushed around. On the wire: one flag bit per tile."""
    signs = torch.where(kept >= 0, 1.0, -1.0)
    return torch.where((kept == 0).all(dim=1, keepdim=True), 0.0, signs)


def decompress(compressed: Compressed) -> torch.Tensor:
    """The tensor whose tile DCTs hold exactly the sent coefficients (zeros elsewhere), on the
    device of what was sent, in the working dtype of its values."""
    return from_tiles(decompress_tiles([compressed]), compressed.shape)


def decompress_tiles(sent: Sequence[Compressed]) -> torch.Tensor:
    """The tiles of `decompress` of each entry, one entry's after the other's (entries of one tile
    shape and device), in one inverse (`idct_of_kept`), or one each if they do not `shares_transform`."""
    if len(sent) > 1 and not all(shares_transform(c.indices.shape[0], c.tile, c.indices.shape[1]) for c in sent):
        return torch.cat([decompress_tiles([c]) for c in sent])
    values = torch.cat([c.values for c in sent])
    return idct_of_kept(torch.cat([c.indices for c in sent]), values.to(working_dtype(values.dtype)), sent[0].tile)


def idct_of_kept(
    indices: torch.Tensor, values: torch.Tensor, tile: tuple[int, int], out: torch.Tensor | None = None
) -> torch.Tensor:
    """The tiles (n_tiles, *tile) whose DCT holds `values` at `indices` (n_tiles, k) and zeros
    elsewhere. A tile of k coefficients is a sum of k outer products of DCT basis rows, k x rows x
    cols multiply-adds, where the dense inverse of the scattered coefficients costs rows x cols x
    (rows + cols): 16 times more for DeMo's 8 of 64 x 64. So under rows + cols coefficients the
    tile is built from its basis rows (one batched product of (rows, k) by (k, cols)), otherwise
    by the dense inverse. Indices must not repeat within a tile unless their values are 0
    (decode refuses repeats; a silent voter's zeros add nothing either way). `out`, if given, of
    the result's shape, is written and returned: a caller that decodes chunk after chunk reuses
    one buffer instead of asking the allocator for megabytes each time."""
    rows, cols = tile
    if indices.shape[1] < rows + cols:
        where, shape = (values.device, values.dtype), indices.shape
        basis_rows = dct_matrix(rows, *where).index_select(0, (indices // cols).flatten())  # 3x faster than [...] here
        left = basis_rows.view(*shape, rows) * values.unsqueeze(-1)  # (n, k, rows)
        right = dct_matrix(cols, *where).index_select(0, (indices % cols).flatten()).view(*shape, cols)
        return torch.bmm(left.transpose(1, 2), right, out=out)
    coefficients = torch.zeros(values.shape[0], rows * cols, device=values.device, dtype=values.dtype)
    tiles = idct(coefficients.scatter_(1, indices, values).view(-1, rows, cols))
    return tiles if out is None else out.copy_(tiles)


def to_bits(values: torch.Tensor, bits: int) -> np.ndarray:
    """Non-negative integers below 2**bits as a flat array of their bits (least significant first)."""
    array = values.flatten().cpu().numpy().astype(np.uint64)
    assert (array < (1 << bits)).all(), "value does not fit in the given bits"
    as_bytes = array.astype("<u8").view(np.uint8).reshape(-1, 8)
    return np.unpackbits(as_bytes, axis=1, count=bits, bitorder="little").flatten()


def read_bits(bit_array: np.ndarray, offset: int, bits: int, count: int) -> tuple[np.ndarray, int]:
    """`count` integers (int64) of `bits` bits read at `offset` of a bit array, and the offset after them."""
    end = offset + count * bits
    if end > len(bit_array):
        raise ValueError("bit stream is too short")
    # each row of bits times its place values: 3x faster than packing the bits back into bytes
    places = (1 << np.arange(bits, dtype=np.uint64)).astype(np.int32 if bits < 31 else np.uint64)
    return (bit_array[offset:end].reshape(count, bits) @ places).astype(np.int64), end  # 64 bits: int64's wrap


def from_bits(bit_array: np.ndarray, offset: int, bits: int, count: int) -> tuple[torch.Tensor, int]:
    """`read_bits` as a tensor."""
    words, end = read_bits(bit_array, offset, bits, count)
    return torch.from_numpy(words), end


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
    except Exception as error:  # noqa: BLE001 (truncated, garbage, wrong types)
        raise PayloadError(f"malformed payload: {type(error).__name__}") from None


def check_fully_read(bit_array: np.ndarray, offset: int) -> None:
    """Only the last byte's padding may follow what was decoded."""
    if len(bit_array) - offset >= 8:
        raise PayloadError("payload has trailing data")
