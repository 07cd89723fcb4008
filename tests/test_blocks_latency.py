"""benchmarks/blocks_latency.py's logic that runs no swarm: the config it writes for each B, the
one line a B that does not split the layers gets, and the issue's figure it checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from swarm.model.denoiser import ModelConfig

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "blocks_latency.py"


def load_benchmark() -> ModuleType:
    """The benchmark as a module (benchmarks/ is a folder of programs, not a package)."""
    spec = importlib.util.spec_from_file_location("blocks_latency", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_benchmark()


def test_each_config_splits_the_default_layers_into_b_blocks_and_changes_nothing_else(tmp_path):
    default = ModelConfig()
    paths = bench.write_configs(bench.block_configs([2, 4, 8]), tmp_path)
    assert sorted(paths) == [2, 4, 8]
    for b, path in paths.items():
        config = ModelConfig.from_json_file(path)  # as swarm-bootstrap --config reads it
        assert (config.n_blocks, config.n_layers) == (b, default.n_layers)
        assert config.layers_per_block == default.n_layers // b
        assert {**config.to_dict(), "n_blocks": default.n_blocks} == default.to_dict()


def test_a_b_that_does_not_split_the_layers_is_one_line_on_stderr():
    ran = subprocess.run([sys.executable, str(SCRIPT), "--blocks", "2", "3"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=False)  # fmt: skip
    assert ran.returncode == 2
    line = "blocks_latency.py: error: invalid model config: n_layers must be a multiple of n_blocks"
    assert ran.stderr.strip().splitlines() == [f"{line} (the default model has {ModelConfig().n_layers} layers)"]


def run(ratio: float) -> dict:
    """What one measure() returns, with the figures summarize() reads."""
    peers = {"a": {"rtt_ms": {"median": 100.0}}, "b": {"rtt_ms": {"median": None}}}
    latency = {"single_pass": {"seconds": 1.0, "hops": 4, "steps_per_block": 4, "bytes": 64},
               "autoregressive": {"seconds": ratio, "hops": 128, "bytes": 64}, "peers": peers,
               "latency_ratio_autoregressive_over_single_pass": ratio}  # fmt: skip
    return {"latency": latency, "fetch": {"seconds": 9.0, "bytes": 10, "spot_check_seconds": 1.0}, "seconds": 60.0}


def test_the_ratio_must_reach_g_over_1_2_for_every_b_in_the_regions_and_loopback_is_only_reported():
    runs = {"regions": {2: run(27.0), 4: run(26.0)}, "loopback": {2: run(3.0)}}
    summary = bench.summarize(runs, gen_len=32)  # bound 26.67
    met = {name: target["met"] for name, target in summary["targets"].items()}
    assert met == {"autoregressive / single pass, B = 2, regions": True,
                   "autoregressive / single pass, B = 4, regions": False}  # fmt: skip
    assert summary["places"]["loopback"][2]["ratio_autoregressive_over_single_pass"] == 3.0
    assert summary["places"]["regions"][2]["rtt_ms_median"] == 100.0  # a peer that never answered left out
