"""Block checkpoints and model folders round-trip exactly; damaged files are user errors."""

import json

import pytest
import torch

from swarm.errors import SwarmError
from swarm.files import write_atomic
from swarm.model.checkpoint import (
    decode_block,
    encode_block,
    load_block,
    load_model_folder,
    read_block_metadata,
    save_block,
    save_model_folder,
)
from swarm.model.denoiser import ModelConfig, build_block, build_end_to_end


def assert_bit_identical(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


def test_block_checkpoint_round_trips_bit_identical(tmp_path, tiny_config):
    block = build_block(tiny_config, 1)
    info = save_block(tmp_path / "b1.safetensors", block, tiny_config, block=1, step=42, swarm="test")
    loaded, step = load_block(tmp_path / "b1.safetensors", tiny_config, 1)
    assert_bit_identical(block, loaded)
    assert step == 42 and info.step == 42 and info.size == (tmp_path / "b1.safetensors").stat().st_size
    metadata = read_block_metadata((tmp_path / "b1.safetensors").read_bytes())
    assert metadata == {
        "format_version": "1",
        "swarm": "test",
        "block": "1",
        "step": "42",
        "config_hash": tiny_config.hash(),
    }
    assert [p.name for p in tmp_path.iterdir()] == ["b1.safetensors"]  # no temp file left behind


def test_the_same_weights_save_to_the_same_bytes_every_time(tiny_config):
    """Replicas that applied the same updates announce one sha256, so their vouchers count together.
    safetensors writes its metadata's keys in a new random order on each save: without the sorted
    header, 20 saves of one block gave about 18 different files."""
    block = build_block(tiny_config, 1)
    files = {encode_block(block, tiny_config, block=1, step=42, swarm="test") for _ in range(20)}
    assert len(files) == 1
    loaded, step = decode_block(files.pop(), tiny_config, 1)
    assert_bit_identical(block, loaded)
    assert step == 42


def test_model_folder_round_trips_bit_identical_with_config_hash(tmp_path, tiny_config):
    blocks = [build_block(tiny_config, b) for b in range(tiny_config.n_blocks)]
    save_model_folder(tmp_path / "m", "blocks", tiny_config, blocks, manifest={"0": "here"})
    loaded = load_model_folder(tmp_path / "m")
    assert loaded.kind == "blocks" and loaded.config == tiny_config and loaded.manifest == {"0": "here"}
    assert json.loads((tmp_path / "m" / "config.json").read_text())["config_hash"] == tiny_config.hash()
    for original, copy in zip(blocks, loaded.modules):
        assert_bit_identical(original, copy)

    whole = build_end_to_end(tiny_config)
    save_model_folder(tmp_path / "m", "end_to_end", tiny_config, [whole])  # replaces the old folder
    assert_bit_identical(whole, load_model_folder(tmp_path / "m").modules[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_checkpoint_for_another_block_or_config_is_refused(tmp_path, tiny_config):
    save_block(tmp_path / "b.safetensors", build_block(tiny_config, 0), tiny_config, block=0, step=1)
    with pytest.raises(SwarmError, match="not block 1"):
        load_block(tmp_path / "b.safetensors", tiny_config, 1)
    other = ModelConfig.from_dict({**tiny_config.to_dict(), "codebook_seed": 9})
    with pytest.raises(SwarmError, match="different model config"):
        load_block(tmp_path / "b.safetensors", other, 0)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip_header"])
def test_corrupt_checkpoint_is_a_user_error(tmp_path, tiny_config, damage):
    path = tmp_path / "b.safetensors"
    save_block(path, build_block(tiny_config, 0), tiny_config, block=0, step=1)
    data = path.read_bytes()
    damaged = {
        "truncate": data[: len(data) // 2],
        "garbage": b"\x00\x01not a checkpoint" * 10,
        "flip_header": data[:8] + b"X" + data[9:],
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(SwarmError):
        load_block(path, tiny_config, 0)


def test_missing_model_folder_is_a_user_error(tmp_path):
    with pytest.raises(SwarmError, match="not a model folder"):
        load_model_folder(tmp_path / "nowhere")


def test_failed_atomic_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "f.bin"
    write_atomic(path, b"old")

    with pytest.raises(TypeError):
        write_atomic(path, "not bytes")  # fails inside the write, after the temp file exists
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_block_with_a_weight_that_is_not_finite_is_refused(tiny_config, value):
    denoiser = build_block(tiny_config, 1)
    with torch.no_grad():
        next(denoiser.parameters()).view(-1)[7] = value
    data = encode_block(denoiser, tiny_config, 1, step=3)
    with pytest.raises(SwarmError, match="not finite"):
        decode_block(data, tiny_config, 1)
