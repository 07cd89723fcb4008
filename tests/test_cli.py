"""The single-machine commands, run as a user runs them, and their answers to bad input."""

import json

import pytest
from helpers import assert_one_line_error, run_command

from swarm.model.steps import REVEAL_ORDERS


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny block model and autoregressive judge trained by swarm-train on a local text file."""
    import conftest

    folder = tmp_path_factory.mktemp("trained")
    (folder / "tiny.json").write_text(json.dumps(conftest.TINY))
    (folder / "corpus.txt").write_text("\n\n".join(conftest.SAMPLE_TEXT[i : i + 300] for i in range(0, 6000, 300)))
    common = ["--config", "tiny.json", "--data", "corpus.txt", "--steps", "15"]
    blocks = run_command("swarm-train", *common, "--out", "model", cwd=folder)
    assert blocks.returncode == 0, blocks.stderr
    judge = run_command("swarm-train", *common, "--kind", "autoregressive", "--out", "judge", cwd=folder)
    assert judge.returncode == 0, judge.stderr
    return folder


def test_train_writes_block_checkpoints_and_an_assembled_model_with_its_steps(trained):
    """The model folder's manifest says each block's steps as swarm-fetch's does (so swarm-demo --start
    takes it), and a baseline's its own."""
    assert sorted(p.name for p in (trained / "checkpoints").iterdir()) == ["block_0.safetensors", "block_1.safetensors"]
    assert {p.name for p in (trained / "model").iterdir()} == {"config.json", "model.safetensors", "manifest.json",
                                                               "README.md"}
    manifest = json.loads((trained / "model" / "manifest.json").read_text())
    assert manifest == {"blocks": {"0": {"step": 15}, "1": {"step": 15}}}
    assert json.loads((trained / "judge" / "manifest.json").read_text()) == {"steps": 15}


def test_eval_prints_every_figure_as_json(trained):
    result = run_command(
        "swarm-eval", "--model", "model", "--judge", "judge", "--text", "corpus.txt", "--windows", "8", cwd=trained
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert len(figures["denoise_ce"]["per_block"]) == 2
    for value in (figures["denoise_ce"]["overall"], figures["chain_ce"], figures["gen_nll"], figures["true_nll"]):
        assert 0 < value < 20
    assert len(figures["bits_per_byte"]["per_block"]) == 2 and 0 < figures["bits_per_byte"]["overall"] < 30
    assert 0 <= figures["real_words"] <= 1 and 0 < figures["true_real_words"] <= 1
    judged = run_command("swarm-eval", "--model", "judge", "--text", "corpus.txt", "--windows", "8", cwd=trained)
    assert judged.returncode == 0, judged.stderr
    assert 0 < json.loads(judged.stdout)["bits_per_byte"]["overall"] < 30  # the same figure for the AR model


def test_generate_prints_a_continuation_of_the_requested_length(trained):
    for reveal in REVEAL_ORDERS:
        result = run_command("swarm-generate", "--model", "model", "--max-bytes", "20", "--reveal", reveal, "The fox",
                             cwd=trained)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert 1 <= len(result.stdout.rstrip("\n").encode()) <= 20 * 3  # replacement chars may widen bytes


def test_training_one_block_alone(trained):
    result = run_command(
        "swarm-train", "--config", "tiny.json", "--data", "corpus.txt", "--steps", "3",
        "--block", "1", "--checkpoint-dir", "alone", cwd=trained,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (trained / "alone").iterdir()] == ["block_1.safetensors"]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["swarm-eval", "--model", "no-such-folder"], ["not a model folder"]),
        (["swarm-eval", "--model", "model", "--text", "missing.txt"], ["no such file"]),
        (["swarm-eval", "--model", "model", "--text", "binary.txt"], ["not UTF-8"]),
        (["swarm-eval", "--model", "broken"], ["corrupt"]),
        (["swarm-eval", "--model", "model", "--judge", "model"], ["autoregressive"]),
        (["swarm-train", "--config", "tiny.json", "--block", "2"], ["out of range"]),
        (["swarm-train", "--config", "tiny.json", "--block", "x"], ["--block"]),
        (["swarm-train", "--config", "missing.json"], ["missing.json"]),
        (["swarm-generate", "--model", "model", "--max-bytes", "0", "hi"], ["--max-bytes"]),
        (["swarm-generate", "--model", "judge", "hi"], ["autoregressive"]),
        (["swarm-generate", "--model", "model", "--reveal", "loudest", "hi"], ["--reveal"]),
        (["swarm-generate", "--model", "model", "--temperature", "1e9", "hi"], ["--temperature"]),
        (["swarm-generate", "--model", "model", "--run-block", "1", "hi"], ["--run-block", "--initial-peers"]),
        (["swarm-generate", "--model", "model", "--run-block", "-1", "hi"], ["--run-block"]),
    ],
)
def test_bad_input_gives_one_line_and_a_nonzero_exit(trained, args, fragments):
    (trained / "binary.txt").write_bytes(bytes(range(128, 256)) * 20)
    broken = trained / "broken"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text((trained / "model" / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert_one_line_error(run_command(*args, cwd=trained), *fragments)


def test_a_join_line_with_several_addresses_is_read_back_whole():
    """The bootstrap prints one join line for all its addresses; every command must take it as is."""
    from swarm.cli.status import status_command
    from swarm.p2p.bootstrap import join_line

    addresses = ["/ip4/127.0.0.1/tcp/1/p2p/A", "/ip4/10.0.0.2/tcp/1/p2p/A"]
    context = status_command.make_context("swarm-status", join_line("demo", "0" * 32, addresses).split())
    assert list(context.params["initial_peers"]) == addresses and context.params["swarm"] == "demo"
