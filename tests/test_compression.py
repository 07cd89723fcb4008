"""DeMo compression: the DCT, tiling, top-k, error feedback and bit packing."""

import pytest
import torch

from swarm.sync import compression
from swarm.sync.compression import (
    batches,
    compress,
    dct,
    decompress,
    decompress_tiles,
    extract,
    extract_many,
    from_bits,
    from_tiles,
    idct,
    idct_of_kept,
    keep_per_tile,
    pack_message,
    tile_side,
    to_bits,
    to_tiles,
    unpack_message,
)


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


def test_error_feedback_keeps_exactly_what_was_not_sent():
    original = torch.randn(64, 128)
    momentum = original.clone()
    sent = extract(momentum, top_k=8, value_bits=32)
    assert torch.allclose(momentum + decompress(sent), original, atol=1e-5)
    remaining, _ = to_tiles(momentum)
    assert torch.allclose(dct(remaining).flatten(1).gather(1, sent.indices), torch.zeros(()), atol=1e-5)
    assert sent.indices.shape == (2, 8)


def test_one_bit_error_feedback_removes_the_kept_components():
    original = torch.randn(256)
    momentum = original.clone()
    sent = extract(momentum, top_k=64 * 64, value_bits=1)  # scaled to 64 per run: everything
    assert set(sent.values.unique().tolist()) <= {-1.0, 1.0}
    assert torch.allclose(momentum, torch.zeros(256), atol=1e-5)


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


def test_tensors_transformed_together_give_the_bits_each_gives_alone():
    """extract_many puts tensors of one tile shape through one transform: each tile's result, the
    momentum left and what is sent, is bit for bit what the tensor alone gives (vectors of a few
    runs included, which the BLAS would compute otherwise in a batch: `shares_transform`)."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(128, 64), (128,), (64, 192), (192,), (320, 64), (2, 12, 7), (320,), (96,), (4096,)]
    momenta = [torch.randn(shape, generator=generator) * 1e-5 for shape in shapes]
    for value_bits in (16, 1, 32):
        together, alone = [m.clone() for m in momenta], [m.clone() for m in momenta]
        sent = extract_many(together, top_k=8, value_bits=value_bits)
        for momentum, left, entry in zip(alone, together, sent):
            own = extract(momentum, top_k=8, value_bits=value_bits)
            assert torch.equal(entry.indices, own.indices) and torch.equal(entry.values, own.values)
            assert torch.equal(left, momentum)
        for same_tile in ([sent[0], sent[2], sent[4]], [sent[1], sent[3], sent[6], sent[8]]):  # 64 x 64; runs of 64
            tiles = decompress_tiles(same_tile).split([entry.indices.shape[0] for entry in same_tile])
            for entry, part in zip(same_tile, tiles):
                assert torch.equal(from_tiles(part, entry.shape), decompress(entry))


def test_batches_group_one_key_in_order_up_to_the_bound(monkeypatch):
    monkeypatch.setattr(compression, "BATCH_ELEMENTS", 100)
    keys = ["a", "b", "a", "a", "b", "a"]
    sizes = [60, 10, 30, 20, 10, 150]
    assert batches(keys, sizes) == [[0, 2], [3], [5], [1, 4]]
