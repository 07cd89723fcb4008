"""One config schema (docs/config.md): strict types, ranges and no unknown field, one line per bad
config, shared by `--config`, a model folder's config.json and the swarm's model record."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from conftest import TINY
from helpers import assert_one_line_error, run_command

from swarm.errors import SwarmError
from swarm.model.checkpoint import load_model_folder, save_model_folder
from swarm.model.denoiser import CONFIG_SCHEMA, ModelConfig, build_block
from swarm.p2p.records import ModelRecord, parse_record

DOCS = Path(__file__).resolve().parent.parent / "docs" / "config.md"


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"n_heads": 2.0}, "n_heads: input should be a valid integer, not 2.0"),  # issue 45: was accepted
        ({"n_layers": True}, "n_layers: input should be a valid integer, not True"),
        ({"d_model": "32"}, "d_model: input should be a valid integer, not '32'"),
        ({"sigma_data": "0.5"}, "sigma_data: input should be a valid number"),
        ({"prefix_cache": 1}, "prefix_cache: input should be a valid boolean"),
        ({"tokenizer": 7}, "tokenizer:"),
        ({"family": "uniform"}, "family: input should be 'masked' or 'gaussian'"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_line_naming_the_field(changes, words):
    with pytest.raises(SwarmError) as caught:
        ModelConfig.from_dict({**TINY, **changes})
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"prefix_len": 0}, "prefix_len"),
        ({"gen_len": 10**6}, "gen_len"),
        ({"d_model": -32}, "d_model"),
        ({"n_blocks": 0}, "n_blocks"),
        ({"n_blocks": 512, "n_layers": 512}, "n_blocks"),
        ({"mlp_ratio": 0}, "mlp_ratio"),
        ({"sigma_data": 0.0}, "sigma_data"),
        ({"p_std": float("inf")}, "p_std"),
        ({"block_overlap": 0.5}, "block_overlap"),
        ({"codebook_seed": -1}, "codebook_seed"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"tokenizer": "abc"}, "tokenizer"),
    ],
)
def test_a_value_out_of_range_is_refused(changes, field):
    with pytest.raises(SwarmError, match=rf"^invalid model config: {field}: "):
        ModelConfig.from_dict({**TINY, **changes})


def test_fields_that_disagree_are_refused():
    for changes in ({"n_layers": 3}, {"d_model": 31}, {"sigma_min": 5.0, "sigma_max": 2.0}, {"vocab_size": 300},
                    {"family": "gaussian", "tie_embeddings": True}):  # fmt: skip
        with pytest.raises(SwarmError, match="^invalid model config: "):
            ModelConfig.from_dict({**TINY, **changes})


def test_unknown_fields_are_named_and_several_problems_counted():
    with pytest.raises(SwarmError, match=r"^model config has unknown fields: \['heads', 'n_experts'\]$"):
        ModelConfig.from_dict({**TINY, "n_experts": 8, "heads": 2})
    with pytest.raises(SwarmError, match=r"\(and 1 more\)$"):
        ModelConfig.from_dict({**TINY, "n_heads": 2.0, "d_model": 0})


def test_values_are_kept_as_written_so_every_hash_stays():
    """An int where a float may be is taken and kept: the hash of a config written so is unchanged."""
    written = {**TINY, "sigma_data": 1, "block_overlap": 0}
    config = ModelConfig.from_dict(written)
    assert config.sigma_data == 1 and isinstance(config.sigma_data, int)
    assert json.loads(json.dumps(config.to_dict()))["sigma_data"] == 1
    assert ModelConfig.from_dict(config.to_dict()).hash() == config.hash()


def test_a_direct_construction_goes_through_the_same_schema():
    with pytest.raises(SwarmError, match="n_heads: input should be a valid integer"):
        ModelConfig(**{**TINY, "n_heads": 2.0})


def test_a_model_folders_config_json_is_a_config_file(tmp_path, tiny_config):
    save_model_folder(tmp_path / "model", "blocks", tiny_config, [build_block(tiny_config, b) for b in range(2)])
    assert ModelConfig.from_json_file(tmp_path / "model" / "config.json") == tiny_config
    folder_file = json.loads((tmp_path / "model" / "config.json").read_text())
    folder_file["model"]["n_heads"] = 2.0
    (tmp_path / "bad.json").write_text(json.dumps(folder_file))
    with pytest.raises(SwarmError, match="n_heads"):
        ModelConfig.from_json_file(tmp_path / "bad.json")
    (tmp_path / "model" / "config.json").write_text(json.dumps(folder_file))
    with pytest.raises(SwarmError, match=r"model/config.json: invalid model config: n_heads: "):
        load_model_folder(tmp_path / "model")


def test_the_model_record_passes_the_same_schema(tiny_config, caplog):
    record = ModelRecord(config=tiny_config.to_dict(), config_hash=tiny_config.hash()).model_dump()
    assert parse_record(ModelRecord, record).config == tiny_config.to_dict()
    for changes in ({"n_heads": 2.0}, {"d_model": 0}, {"n_experts": 8}):
        assert parse_record(ModelRecord, {**record, "config": {**record["config"], **changes}}) is None
    parse_record(ModelRecord, {**record, "config": {**record["config"], "n_heads": 2.0}}, logging.WARNING)
    assert "config.n_heads: Input should be a valid integer" in caplog.records[-1].getMessage()  # what a reader says
    assert parse_record(ModelRecord, {**record, "new_term": 1}) is not None  # a record stays tolerant itself


def test_the_docs_name_every_field_and_their_example_is_a_config():
    text = DOCS.read_text()
    for field in CONFIG_SCHEMA.model_fields:
        assert f"`{field}`" in text, field
    example = re.search(r"```json\n(.*?)```", text, flags=re.DOTALL).group(1)
    ModelConfig.from_dict(json.loads(example))


@pytest.mark.parametrize("changes", [{"n_heads": 2.0}, {"d_model": 0}, {"n_experts": 8}])
def test_new_swarm_with_a_bad_config_is_one_line_before_anything_starts(tmp_path, changes):
    (tmp_path / "bad.json").write_text(json.dumps({**TINY, **changes}))
    result = run_command("swarm-bootstrap", "--new-swarm", "--config", "bad.json", "--creator-key", "creator.key",
                         "--swarm", "bad-config", cwd=tmp_path, timeout=60)  # fmt: skip
    assert_one_line_error(result, "model config", next(iter(changes)))
    assert not (tmp_path / "creator.key").exists()  # no key made, no node started, nothing published
