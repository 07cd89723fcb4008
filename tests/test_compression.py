"""DeMo compression: the DCT, tiling, top-k, error feedback and bit packing."""

import pytest
import torch

from swarm.sync import compression
from swarm.sync.compression import (
    add_tiles_,
    batches,
    dct,
    decompress,
    decompress_tiles,
    from_bits,
    from_tiles,
    idct,
    idct_of_kept,
    keep_per_tile,
    pack_message,
    take_top_k,
    tile_coefficients,
    tile_side,
    to_bits,
    to_tiles,
    unpack_message,
)


def compress(tensor: torch.Tensor, top_k: int, value_bits: int = 16):
    return take_top_k(tile_coefficients(tensor), tensor.shape, top_k, value_bits)


@pytest.mark.parametrize("shape", [(5, 64, 64), (3, 1, 48), (2, 12, 7)])
def test_dct_then_inverse_is_the_identity(shape):
    tiles = torch.randn(shape)
    assert torch.allclose(idct(dct(tiles)), tiles, atol=1e-5)
    assert torch.allclose(dct(tiles).norm(), tiles.norm(), rtol=1e-5)  # orthonormal: energy kept


@pytest.mark.parametrize("shape", [(256,), (768, 256), (96, 256), (4, 6, 10)])
def test_tiles_round_trip_and_respect_the_largest_divisor(shape):
    tensor = torch.randn(shape)
    tiles, tile = to_tiles(tensor)
    assert torch.equal(from_tiles(tiles, tensor.shape), tensor)
    assert all(t <= 64 for t in tile)
    assert tile_side(768) == 64 and tile_side(96) == 48 and tile_side(97) == 1


def test_keep_scales_with_tile_size():
    assert keep_per_tile(8, 64 * 64) == 8
    assert keep_per_tile(8, 64) == 1  # a 1-D run of 64 keeps one value, not 8
    assert keep_per_tile(10_000, 64) == 64


def test_full_k_reproduces_the_momentum_and_its_sign_step():
    momentum = torch.randn(128, 64) * 1e-5
    restored = decompress(compress(momentum, top_k=64 * 64, value_bits=32))
    assert torch.allclose(restored, momentum, atol=1e-9)
    assert torch.equal(restored.sign(), momentum.sign())


@pytest.mark.parametrize("tile, k", [((48, 64), 8), ((64, 64), 8), ((2, 42), 3), ((1, 64), 1), ((8, 8), 20)])
def test_kept_coefficients_decode_as_the_dense_inverse_does(tile, k):
    """`idct_of_kept` from basis rows (k under rows + cols) or densely ((8, 8) with 20) equals the
    inverse DCT of the coefficients scattered into their tiles, on square and oblong tiles."""
    generator = torch.Generator().manual_seed(k)
    rows, cols = tile
    indices = torch.rand(5, rows * cols, generator=generator).argsort(dim=1)[:, :k].sort(dim=1).values
    values = torch.randn(5, k, generator=generator)
    dense = idct(torch.zeros(5, rows * cols).scatter_(1, indices, values).view(5, rows, cols))
    assert torch.allclose(idct_of_kept(indices, values, tile), dense, atol=1e-6)


@pytest.mark.parametrize("shape", [(128, 192), (96, 64), (256,), (4, 6, 10), (3, 128, 2)])
def test_tile_coefficients_are_the_dct_of_each_tile(shape):
    """Two large products give what the per-tile transform gives, tile by tile."""
    tensor = torch.randn(shape, dtype=torch.float64)
    tiles, _ = to_tiles(tensor)
    assert torch.allclose(tile_coefficients(tensor), dct(tiles).flatten(1), atol=1e-12)


@pytest.mark.parametrize("value_bits", [32, 16])
def test_error_feedback_keeps_exactly_what_was_not_sent(value_bits):
    original = torch.randn(64, 128)
    coefficients = tile_coefficients(original)
    sent = take_top_k(coefficients, original.shape, top_k=8, value_bits=value_bits)
    left = from_tiles(idct(coefficients.view(-1, 64, 64)), original.shape)
    assert torch.allclose(left + decompress(sent), original, atol=1e-5)
    assert sent.indices.shape == (2, 8)
    if value_bits == 32:
        assert (coefficients.gather(1, sent.indices) == 0).all()
    else:  # bfloat16's rounding of what was sent stays in the momentum, and nothing else of it
        rounding = coefficients.gather(1, sent.indices)
        assert (rounding != 0).any() and (rounding.abs() <= sent.values.float().abs() * 2**-8).all()


def test_one_bit_error_feedback_removes_the_kept_components():
    coefficients = tile_coefficients(torch.randn(256))
    sent = take_top_k(coefficients, torch.Size([256]), top_k=64 * 64, value_bits=1)  # scaled to 64 per run: everything
    assert set(sent.values.unique().tolist()) <= {-1.0, 1.0}
    assert (coefficients == 0).all()


@pytest.mark.parametrize("shape", [(128, 192), (256,), (4, 6, 10)])
def test_tiles_are_added_in_place_where_from_tiles_puts_them(shape):
    tensor = torch.randn(shape)
    tiles, _ = to_tiles(torch.randn(shape))
    expected = tensor - 0.5 * from_tiles(tiles, tensor.shape)
    add_tiles_(tensor, tiles, -0.5)
    assert torch.equal(tensor, expected)


def test_bit_packing_round_trips_and_counts_bytes():
    values = torch.randint(0, 4096, (1000,))
    data = pack_message({"v": 12}, [to_bits(values, 12)])
    (bits,), bit_array = unpack_message(data, ("v",))
    assert bits == 12 and len(bit_array) == 12_000  # 1,500 bytes
    assert torch.equal(from_bits(bit_array, 0, 12, 1000)[0], values)
    compressed = compress(torch.randn(64, 64), top_k=8)
    assert compressed.payload_bytes(16) == 8 * (12 + 16) // 8


def test_one_bit_sends_nothing_for_a_tile_without_gradient():
    momentum = torch.zeros(64, 128)
    momentum[:, 64:] = torch.randn(64, 64)
    sent = compress(momentum, top_k=8, value_bits=1)
    assert (sent.values[0] == 0).all() and (sent.values[1].abs() == 1).all()
    assert (decompress(sent)[:, :64] == 0).all()


def test_tensors_decoded_together_give_the_bits_each_gives_alone():
    """decompress_tiles puts the entries of one tile shape through one inverse: each tile's result
    is bit for bit what the tensor alone gives (vectors of a few runs included, which the BLAS
    would compute otherwise in a batch: `shares_transform`)."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(128, 64), (128,), (64, 192), (192,), (320, 64), (2, 12, 7), (320,), (96,), (4096,)]
    momenta = [torch.randn(shape, generator=generator) * 1e-5 for shape in shapes]
    for value_bits in (16, 1, 32):
        sent = [compress(momentum, top_k=8, value_bits=value_bits) for momentum in momenta]
        for same_tile in ([sent[0], sent[2], sent[4]], [sent[1], sent[3], sent[6], sent[8]]):  # 64 x 64; runs of 64
            tiles = decompress_tiles(same_tile).split([entry.indices.shape[0] for entry in same_tile])
            for entry, part in zip(same_tile, tiles):
                assert torch.equal(from_tiles(part, entry.shape), decompress(entry))


def test_batches_group_one_key_in_order_up_to_the_bound(monkeypatch):
    monkeypatch.setattr(compression, "BATCH_ELEMENTS", 100)
    keys = ["a", "b", "a", "a", "b", "a"]
    sizes = [60, 10, 30, 20, 10, 150]
    assert batches(keys, sizes) == [[0, 2], [3], [5], [1, 4]]
