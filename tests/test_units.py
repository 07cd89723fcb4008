"""The model's units: a byte-level BPE pinned by the config, carried by model folders and the swarm.

The swarm tests here run the paths every byte test runs (training, checkpoints, fetch, generation
through peers) on a tiny model of tokens, with a tokenizer trained in the test: none of the
processes but the creator's bootstrap has it, so each must get it from the swarm.
"""

from __future__ import annotations

import json
import random

import datasets
import pytest
import torch
from conftest import SAMPLE_TEXT, TINY
from swarm_helpers import FAST_PEER, write_tiny_setup

from swarm.errors import SwarmError
from swarm.lab.launch import LocalSwarm
from swarm.model import units as units_module
from swarm.model.checkpoint import decode_block, encode_block, load_model_folder
from swarm.model.data import Windows, to_unit_stream
from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.families import local_runner
from swarm.model.generate import continue_text, prefix_tensor
from swarm.model.units import BYTES, TOKENIZER_FILE, TokenUnits, add_tokenizer, train_tokenizer
from swarm.serving.remote import RemoteBlocks
from swarm.waiting import wait_for

SWARM = "unitstest"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test starts with no tokenizer but the built-in one: an empty cache, nothing in memory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(units_module, "_known", {})


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> bytes:
    """A byte-level BPE of 300 units trained on the tests' sample text (the built-in one has 8192)."""
    return train_tokenizer([SAMPLE_TEXT[i : i + 200] for i in range(0, len(SAMPLE_TEXT), 200)], 300)


def tiny_tokens(tokenizer: bytes) -> ModelConfig:
    units = add_tokenizer(tokenizer, keep=False)
    return ModelConfig(**{**TINY, "vocab_size": units.vocab_size, "tokenizer": units.sha256, "tie_embeddings": True})


def random_text(rng: random.Random, length: int) -> str:
    """Text from every corner of Unicode: ASCII, controls, accents, CJK, emoji, combining marks."""
    pools = [(0, 0x7F), (0x80, 0x7FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0x300, 0x36F), (0x10000, 0x10FFFF)]
    chars = []
    while len(chars) < length:
        lo, hi = rng.choice(pools)
        code = rng.randint(lo, hi)
        if not 0xD800 <= code <= 0xDFFF:  # surrogates are not characters: UTF-8 cannot hold them
            chars.append(chr(code))
    return "".join(chars)


@pytest.mark.parametrize("which", ["built-in", "trained here"])
def test_any_utf8_text_round_trips_through_the_tokenizer(which, tokenizer_file):
    units = ModelConfig().units() if which == "built-in" else add_tokenizer(tokenizer_file, keep=False)
    rng = random.Random(0)
    texts = ["", "\x00", "\r\n\r\n", "  leading and trailing  ", "The history of the city", SAMPLE_TEXT[:500]]
    texts += [random_text(rng, rng.randint(1, 200)) for _ in range(200)]
    for text in texts:
        ids = units.encode(text)
        assert all(0 <= i < units.vocab_size for i in ids)
        assert units.decode(ids) == text.encode("utf-8"), text
    # a unit's bytes may end inside a character: decoding never goes through str
    emoji = units.encode("\U0001f600")
    assert b"".join(units.decode([i]) for i in emoji) == "\U0001f600".encode()
    assert int(units.byte_lengths[torch.tensor(units.encode(SAMPLE_TEXT))].sum()) == len(SAMPLE_TEXT.encode())


def test_the_config_hash_changes_with_the_tokenizer(tokenizer_file):
    config = tiny_tokens(tokenizer_file)
    other = add_tokenizer(train_tokenizer([SAMPLE_TEXT[::-1]], 300), keep=False)
    assert other.sha256 != config.tokenizer
    assert ModelConfig(**{**config.to_dict(), "tokenizer": other.sha256}).hash() != config.hash()
    with pytest.raises(SwarmError, match="256 units"):
        ModelConfig(**{**TINY, "vocab_size": 300})  # bytes with more units than bytes
    with pytest.raises(SwarmError, match="tokenizer"):
        ModelConfig(**{**config.to_dict(), "tokenizer": "not-a-hash"})


def test_a_tokenizer_is_believed_only_if_it_hashes_to_the_config(tokenizer_file):
    config = tiny_tokens(tokenizer_file)
    units_module._known.clear()
    with pytest.raises(SwarmError, match="not on this machine"):
        config.units()
    with pytest.raises(SwarmError, match="sha256"):
        add_tokenizer(train_tokenizer([SAMPLE_TEXT[::-1]], 300), config.tokenizer)
    with pytest.raises(SwarmError, match="not a tokenizer"):
        add_tokenizer(b"{not json", None)
    assert add_tokenizer(tokenizer_file, config.tokenizer).vocab_size == config.vocab_size
    assert config.units().sha256 == config.tokenizer


def test_a_checkpoint_of_another_tokenizer_is_refused(tokenizer_file):
    config = tiny_tokens(tokenizer_file)
    other_units = add_tokenizer(train_tokenizer([SAMPLE_TEXT[::-1]], 300), keep=False)
    other = ModelConfig(**{**config.to_dict(), "vocab_size": other_units.vocab_size, "tokenizer": other_units.sha256})
    data = encode_block(build_block(other, 0), other, 0, step=3)
    with pytest.raises(SwarmError, match="config hash"):
        decode_block(data, config, 0)


def test_the_windows_are_units_and_bits_per_byte_count_bytes(tokenizer_file):
    config = tiny_tokens(tokenizer_file)
    units = config.units()
    documents = datasets.Dataset.from_dict({"text": [SAMPLE_TEXT[:300], SAMPLE_TEXT[300:600]]})
    stream = to_unit_stream(documents, units)
    assert units.decode(stream.tolist()) == (SAMPLE_TEXT[:300] + "\n\n" + SAMPLE_TEXT[300:600]).encode()
    assert len(stream) < 600 / 2  # a unit stands for several bytes of this text
    assert torch.equal(to_unit_stream(documents, BYTES).long(), torch.tensor(list(units.decode(stream.tolist()))))
    windows = Windows(stream, config.seq_len).fixed(4)
    assert windows.shape == (4, config.seq_len) and int(windows.max()) < config.vocab_size


def test_a_prompt_becomes_the_last_p_units_padded_with_a_space(tokenizer_file):
    config = tiny_tokens(tokenizer_file)
    units = config.units()
    short = prefix_tensor("The quick", config)[0].tolist()
    assert short[-len(units.encode("The quick")) :] == units.encode("The quick")
    assert set(short[: -len(units.encode("The quick"))]) == {units.encode(" ")[0]}
    long = prefix_tensor(SAMPLE_TEXT, config)[0].tolist()
    assert long == units.encode(SAMPLE_TEXT)[-config.prefix_len :]


def test_a_model_folder_holds_its_tokenizer_and_loads_from_it_alone(tokenizer_file, tmp_path, monkeypatch):
    from swarm.model.checkpoint import save_model_folder

    config = tiny_tokens(tokenizer_file)
    folder = tmp_path / "model"
    save_model_folder(folder, "blocks", config, [build_block(config, b) for b in range(config.n_blocks)])
    assert (folder / TOKENIZER_FILE).read_bytes() == tokenizer_file
    units_module._known.clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    model = load_model_folder(folder)
    text = b"".join(continue_text(local_runner(model.denoiser_for_block, config), config, "The quick", 30, 2))
    assert len(text) == 30
    units_module._known.clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere-again"))
    (folder / TOKENIZER_FILE).write_bytes(train_tokenizer([SAMPLE_TEXT[::-1]], 300))
    with pytest.raises(SwarmError, match="tokenizer"):
        load_model_folder(folder)  # a folder's tokenizer.json that is not the config's counts for nothing


def test_a_swarm_of_tokens_hands_its_tokenizer_to_peers_and_clients(tokenizer_file, tmp_path, monkeypatch):
    """Only the creator's bootstrap holds the tokenizer: the peers and the client fetch it from the
    swarm, the fetched folder carries it, and generation through the peers writes what the fetched
    model writes here for the same seed."""
    config = tiny_tokens(tokenizer_file)
    _, corpus_path = write_tiny_setup(tmp_path)
    creator_folder = tmp_path / "creator"
    creator_folder.mkdir()
    (creator_folder / "tiny.json").write_text(json.dumps(config.to_dict()))
    (creator_folder / TOKENIZER_FILE).write_bytes(tokenizer_file)  # beside --config: the creator's tokenizer
    units_module._known.clear()
    with LocalSwarm(tmp_path, swarm=SWARM, config_path=str(creator_folder / "tiny.json"), data=corpus_path) as local:
        local.start_bootstrap(refresh_period=2)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "peers-cache"))
        for block in range(config.n_blocks):
            local.start_peer(f"p{block}", str(block), FAST_PEER)
        with local.client() as client:
            assert client.wait_for_model(30).hash() == config.hash()  # its tokenizer came from a peer
            assert (tmp_path / "peers-cache" / "blockswarm" / "tokenizers" / f"{config.tokenizer}.json").is_file()
            serving = lambda: client.directory.every_block_served(config.n_blocks)
            wait_for(serving, 120, "every block served")
            fetched = local.run("swarm-fetch", "--out", "model")
            assert fetched.returncode == 0, fetched.stderr
            model = load_model_folder(tmp_path / "model")
            assert (tmp_path / "model" / TOKENIZER_FILE).read_bytes() == tokenizer_file
            remote = RemoteBlocks(client.directory, client.p2p, client.loop, config, request_timeout=10)
            through_peers = b"".join(continue_text(remote, config, "The quick", 40, steps_per_block=2, seed=3))
        here = b"".join(continue_text(local_runner(model.denoiser_for_block, config), config, "The quick", 40,
                                      steps_per_block=2, seed=3))  # fmt: skip
    assert through_peers == here and len(here) == 40


def test_a_lying_peer_is_not_believed_about_the_tokenizer(tokenizer_file, tmp_path):
    """A peer that answers with another tokenizer is refused, and the next is asked."""
    from hivemind import DHT

    from swarm.p2p.network import EventLoopThread
    from swarm.p2p.tokenizer import TokenizerServicer, units_from_swarm

    config = tiny_tokens(tokenizer_file)
    honest, liar = TokenUnits(tokenizer_file), TokenUnits(train_tokenizer([SAMPLE_TEXT[::-1]], 300))
    liar.sha256 = config.tokenizer  # it claims the asked hash, and sends its own file
    units_module._known.clear()
    nodes = [DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])]
    nodes += [DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=nodes[0].get_visible_maddrs())
              for _ in range(2)]  # fmt: skip
    loop = EventLoopThread()
    try:
        handles = [loop.run(node.replicate_p2p(), 30) for node in nodes]
        loop.run(TokenizerServicer(liar).add_p2p_handlers(handles[0]), 30)
        loop.run(TokenizerServicer(honest).add_p2p_handlers(handles[1]), 30)
        ids = [node.peer_id.to_base58() for node in nodes[:2]]
        with pytest.raises(SwarmError, match="no peer"):
            units_from_swarm(config, loop, handles[2], lambda: ids[:1])  # the liar alone
        assert units_from_swarm(config, loop, handles[2], lambda: ids).sha256 == config.tokenizer
    finally:
        for node in nodes:
            node.shutdown()


def test_demo_replicas_of_a_block_of_tokens_stay_identical_and_learn(tokenizer_file):
    """DeMo's compression, vote and error feedback on a tied table of vocab_size + 1 rows: replicas that
    gather the same payloads stay bit-identical, as the checkpoint agreement needs."""
    from test_decoupled_momentum import backward, replicas, senders

    from swarm.sync.decoupled_momentum import DeMoConfig, decode_payload, encode_payload

    config = tiny_tokens(tokenizer_file)
    documents = datasets.Dataset.from_dict({"text": [SAMPLE_TEXT]})
    windows = Windows(to_unit_stream(documents, config.units()), config.seq_len)
    blocks, reps = replicas(config, 2, DeMoConfig(value_bits=16, step_lr=2e-3))
    losses = []
    for step in range(30):
        wires = []
        for index, (block, replica) in enumerate(zip(blocks, reps)):
            losses.append(backward(block, windows, seed=1000 * index + step))
            wires.append(encode_payload(replica.make_payload(lr=2e-3), 16))
        for index, replica in enumerate(reps):
            assert replica.apply(senders(decode_payload(w, replica) for w in wires), f"r{index}") == ["r0", "r1"]
    for a, b in zip(blocks[0].parameters(), blocks[1].parameters()):
        assert torch.equal(a, b)
    assert sum(losses[-10:]) / 10 < 0.95 * sum(losses[:10]) / 10
