"""Every model folder explains itself: README.md says what the model is, where it came from, what
is known of its quality (in the units it was measured in) and how to load it."""

from __future__ import annotations

import re

import pytest
from conftest import TINY

from swarm.model.autoregressive import ByteTransformer
from swarm.model.checkpoint import load_model_folder, save_model_folder
from swarm.model.denoiser import BUILTIN_TOKENIZER, ModelConfig, build_block, build_end_to_end, count_parameters


def fetched_manifest(config: ModelConfig) -> dict:
    """A manifest as swarm-fetch writes it (swarm/checkpoints/assemble.py)."""
    entry = {"public_name": "", "sha256": "a" * 64, "candidates_measured": 1}
    return {"swarm": "cards", "config_hash": config.hash(), "spot_check_seconds": 1.5, "blocks": {
        "0": {**entry, "peer_id": "12D3KooWHostA", "public_name": "alice", "step": 120,
              "vouched_by": ["12D3KooWHostA", "12D3KooWHostB"], "spot_check_loss": 2.3456},
        "1": {**entry, "peer_id": "12D3KooWHostC", "step": 118, "vouched_by": ["12D3KooWHostC"],
              "spot_check_loss": 1.25},
    }}  # fmt: skip


def test_a_fetched_models_card_says_what_it_is_where_it_came_from_and_how_it_scored(tmp_path, tiny_config):
    blocks = [build_block(tiny_config, b) for b in range(tiny_config.n_blocks)]
    save_model_folder(tmp_path / "fetched", "blocks", tiny_config, blocks, fetched_manifest(tiny_config))
    card = (tmp_path / "fetched" / "README.md").read_text()
    assert "DiffusionBlocks model: 2 blocks of 2 layers" in card
    assert "raw bytes (256 units)" in card and "16 units of context, 8 written at once" in card
    assert f"parameters: {sum(map(count_parameters, blocks)):,}" in card
    assert tiny_config.hash() in card
    assert "swarm `cards`" in card
    assert "| 0 | 120 | 12D3KooWHostA (alice) | 2: 12D3KooWHostA, 12D3KooWHostB |" in card
    assert "| 1 | 118 | 12D3KooWHostC | 1: 12D3KooWHostC |" in card
    assert "in nats per unit (a unit is one byte)" in card and "- block 0: 2.346" in card
    assert not re.search(r"bits per byte[^.\n]*2\.346", card)  # a spot-check loss is never called bits per byte
    assert "Bits per byte: not measured" in card
    load_model_folder(tmp_path / "fetched")  # the card is beside the model, not in its way


def test_the_cards_python_lines_load_the_folder_as_written(tmp_path, tiny_config, monkeypatch):
    save_model_folder(tmp_path / "model", "blocks", tiny_config, [build_block(tiny_config, b) for b in range(2)])
    card = (tmp_path / "model" / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", card, flags=re.DOTALL).group(1)
    assert 'swarm.load("model")' in code and '`swarm-generate --model model "' in card
    from swarm.api import Writer

    written = Writer.generate  # as written, but a few bytes: the tiny model is slow to write 128
    monkeypatch.setattr(Writer, "generate", lambda self, prompt, **options: written(self, prompt, max_bytes=8))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})


def test_a_model_of_tokens_names_its_tokenizer(tmp_path):
    config = ModelConfig(**{**TINY, "vocab_size": 8192, "tokenizer": BUILTIN_TOKENIZER, "tie_embeddings": True})
    save_model_folder(tmp_path / "m", "blocks", config, [build_block(config, b) for b in range(2)])
    card = (tmp_path / "m" / "README.md").read_text()
    assert f"byte-level BPE of 8192 units (tokenizer.json, sha256 {BUILTIN_TOKENIZER})" in card


@pytest.mark.parametrize("kind", ["end_to_end", "autoregressive"])
def test_a_baselines_card_gives_its_steps_and_what_it_is_for(tmp_path, tiny_config, kind):
    module = build_end_to_end(tiny_config) if kind == "end_to_end" else ByteTransformer(tiny_config)
    save_model_folder(tmp_path / "base", kind, tiny_config, [module], {"steps": 300})
    card = (tmp_path / "base" / "README.md").read_text()
    assert "trained on one machine by swarm-train for 300 steps" in card.lower()
    assert f"parameters: {count_parameters(module):,}\n" in card
    if kind == "autoregressive":
        assert "--judge base" in card and "swarm.load" not in card  # swarm.load refuses a judge
    else:
        assert 'swarm.load("base")' in card and "Spot-check" not in card


def test_blocks_trained_here_give_each_blocks_step(tmp_path, tiny_config):
    manifest = {"blocks": {"0": {"step": 300}, "1": {"step": 280}}}  # as swarm-train writes it
    save_model_folder(tmp_path / "m", "blocks", tiny_config, [build_block(tiny_config, b) for b in range(2)], manifest)
    assert "block 0 at step 300, block 1 at step 280." in (tmp_path / "m" / "README.md").read_text()
