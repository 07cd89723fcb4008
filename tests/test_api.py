"""The Python API as the README shows it: its lines run as written, against a model folder and a test swarm."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import TINY
from swarm_helpers import tiny_swarm

import swarm
from swarm.api import JoinLine
from swarm.errors import SwarmError
from swarm.model.checkpoint import load_model_folder, save_model_folder
from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.families import local_runner
from swarm.model.generate import continue_text

README = Path(__file__).resolve().parent.parent / "README.md"
PLACEHOLDER_JOIN = re.compile(r'"(--swarm [^"]*--initial-peers [^"]*)"')


def readme_python() -> str:
    """The README's Python block, after its `<!-- api:` marker."""
    text = README.read_text()
    block = text[text.index("<!-- api:") :]
    return block[block.index("```python\n") + len("```python\n") : block.index("\n```", block.index("```python"))]


def folder_lines(code: str) -> str:
    return code[: code.index("with swarm.connect")]


@pytest.fixture
def tiny_folder(tmp_path, monkeypatch) -> Path:
    """demo/model under the working directory: a tiny model of two blocks, as the README's line names it."""
    config = ModelConfig(**TINY)
    torch.manual_seed(0)  # the same weights, and so the same text, every run
    save_model_folder(tmp_path / "demo" / "model", "blocks", config, [build_block(config, b) for b in range(2)])
    monkeypatch.chdir(tmp_path)
    return tmp_path / "demo" / "model"


def test_the_readme_loads_a_model_folder_and_writes_text_as_written(tiny_folder, capsys):
    exec(compile(folder_lines(readme_python()), "README.md", "exec"), {})
    written = capsys.readouterr().out
    assert 0 < len(written.rstrip("\n")) <= 100  # 100 bytes: at most as many characters


def test_a_loaded_model_writes_what_continue_text_writes(tiny_folder):
    model, loaded = swarm.load(tiny_folder), load_model_folder(tiny_folder)
    expected = b"".join(continue_text(local_runner(loaded.denoiser_for_block, loaded.config), loaded.config,
                                      "Swarms of", 40, steps_per_block=2, seed=3))  # fmt: skip
    assert model.generate("Swarms of", max_bytes=40, steps_per_block=2, seed=3) == expected.decode("utf-8", "replace")
    assert "".join(model.stream("Swarms of", max_bytes=40, steps_per_block=2, seed=3)) == model.generate(
        "Swarms of", max_bytes=40, steps_per_block=2, seed=3)
    with pytest.raises(SwarmError, match="temperature"):
        model.generate("x", temperature=-1)


def test_a_join_line_is_read_as_the_bootstrap_prints_it():
    line = ("--swarm s --creator " + "a" * 32
            + " --initial-peers /ip4/1.2.3.4/tcp/1/p2p/A --initial-peers /ip4/5.6.7.8/tcp/2/p2p/B")
    assert JoinLine.parse(line) == JoinLine("s", ["/ip4/1.2.3.4/tcp/1/p2p/A", "/ip4/5.6.7.8/tcp/2/p2p/B"], "a" * 32)
    for bad in ["--swarm s", "--swarm s --initial-peers", "--port 1 --initial-peers /ip4/1.2.3.4/tcp/1/p2p/A"]:
        with pytest.raises(SwarmError):
            JoinLine.parse(bad)


def test_the_readme_writes_and_fetches_through_a_swarm_as_written(tmp_path, monkeypatch, capsys):
    with tiny_swarm(tmp_path, "apitest", {"a": "0", "b": "1"}) as (local, _, client):
        join = f"--swarm apitest --initial-peers {local.initial_peers[0]}"
        code = PLACEHOLDER_JOIN.sub(repr(join), readme_python()[len(folder_lines(readme_python())) :])
        monkeypatch.chdir(tmp_path)
        code = code.replace("swarm.connect(", f"swarm.connect(data={local.data!r}, join_line=")
        exec(compile(code, "README.md", "exec"), {"swarm": swarm})
        fetched = load_model_folder(tmp_path / "my-model")
        written = capsys.readouterr().out.rstrip("\n")
        here = b"".join(continue_text(local_runner(fetched.denoiser_for_block, fetched.config), fetched.config,
                                      "The history of", 128))  # fmt: skip
    assert written == here.decode("utf-8", "replace")
