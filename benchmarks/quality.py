"""Quality, memory and speed: each model family's blocks against their two baselines, at equal compute.

For each family of --families (default: both), trains every block of the block model for
--steps steps (a block costs 1/B of the end-to-end model, so B blocks at N steps each equal
the end-to-end model at N steps) and the end-to-end denoiser for --steps steps; then the
autoregressive byte transformer (about the same parameter count) for --steps steps. Each
model trains in its own process, one after another (swarm/lab/trainjobs.py), so peak memory
is that trainer's alone and none steals the others' cores. All are scored on the same
validation windows (swarm/model/evaluate.py): bits per byte (a masked model's exact likelihood, with the
ELBO the papers report beside it), the share of real words in what they write, gen_nll under the AR model as judge,
chain_ce and denoise_ce; for the gaussian family also where its chain hands each block its
span (`path_norms`, 1.0 = on the training path). Writes quality.json and quality.png (bits
per byte against steps) under --out and prints the JSON without the curves.

    python benchmarks/quality.py                      # both families, 300 steps: about an hour on 2 cores
    python benchmarks/quality.py --families masked --steps 20   # a quick look
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from swarm.cli.console import setup_logging
from swarm.errors import SwarmError
from swarm.files import write_atomic, write_picture
from swarm.lab.trainjobs import run_jobs
from swarm.model.autoregressive import generate_bytes
from swarm.model.checkpoint import load_block, load_model_folder
from swarm.model.compressors import compressor_bits_per_byte
from swarm.model.data import load_corpus
from swarm.model.denoiser import FAMILIES, ModelConfig
from swarm.model.diffusion import GaussianFamily
from swarm.model.evaluate import NOISE_SEED, evaluate_autoregressive, evaluate_denoiser
from swarm.model.families import generate_span, local_runner
from swarm.model.steps import REVEAL_ORDERS, Sampling
from swarm.model.train import checked_device, default_lr
from swarm.model.words import vocabulary

logger = logging.getLogger("benchmarks.quality")

SAMPLES = 3  # continuations shown per model


def family_config(config: ModelConfig, family: str) -> ModelConfig:
    untied = {"tie_embeddings": False} if family == "gaussian" else {}  # its input is a codebook, not a table
    return ModelConfig.from_dict({**config.to_dict(), "family": family, **untied})


def make_jobs(configs: dict[str, ModelConfig], corpus, args, workdir: Path) -> list[dict]:
    """The blocks and the end-to-end model of every family, then the autoregressive baseline."""
    units = next(iter(configs.values())).units()
    common = {
        "train": corpus.stream("train", units),
        "validation": corpus.stream("validation", units),
        "train_config": {"steps": args.steps, "batch_size": args.batch_size, "seed": 0},
        "threads": args.threads,
        "device": args.device,
        "curve_every": max(1, args.steps // args.curve_points),
    }
    jobs = []
    for family, config in configs.items():
        common_here = {**common, "config": config.to_dict()}
        jobs += [{**common_here, "kind": "block", "block": b, "name": f"{family} block {b}",
                  "save_to": str(workdir / family / f"block{b}")} for b in range(config.n_blocks)]  # fmt: skip
        jobs.append({**common_here, "kind": "end_to_end", "name": f"{family} end-to-end",
                     "save_to": str(workdir / family / "e2e")})
    any_config = next(iter(configs.values()))
    jobs.append({**common, "config": any_config.to_dict(), "kind": "autoregressive", "name": "autoregressive",
                 "save_to": str(workdir / "ar")})  # fmt: skip
    return jobs


def text(rows: torch.Tensor, config: ModelConfig) -> list[str]:
    units = config.units()
    return [units.decode(r.tolist()).decode("utf-8", errors="replace") for r in rows]


def samples(config: ModelConfig, windows: torch.Tensor, models: dict, steps_per_block: int, sampling: Sampling) -> dict:
    """A few continuations from each denoiser after the same validation prefixes."""
    prefix = windows[:SAMPLES, : config.prefix_len]
    out = {}
    for name, denoiser_for_block in models.items():
        generator, run_block = torch.Generator().manual_seed(0), local_runner(denoiser_for_block, config)
        out[name] = text(generate_span(run_block, config, prefix, steps_per_block, generator, sampling)[0], config)
    return out


def evaluate_family(config: ModelConfig, workdir: Path, windows: torch.Tensor, judge, known, args) -> dict:
    """Every figure of one family's blocks and end-to-end model."""
    folder = workdir / config.family
    blocks = [load_block(folder / f"block{b}", config, b)[0].eval() for b in range(config.n_blocks)]
    e2e = load_model_folder(folder / "e2e").modules[0].eval()
    models = {"blocks": lambda b: blocks[b], "end_to_end": lambda b: e2e}
    sampling = Sampling(reveal=args.reveal)
    figures = {name: evaluate_denoiser(m, config, windows, args.steps_per_block, judge, known, sampling)
               for name, m in models.items()}  # fmt: skip
    bpb = {name: f["bits_per_byte"]["overall"] for name, f in figures.items()}
    result = {
        "figures": figures,
        "bits_per_byte": bpb,
        "blocks_over_end_to_end": bpb["blocks"] / bpb["end_to_end"],
        "samples": samples(config, windows, models, args.steps_per_block, sampling),
    }
    if config.family == "gaussian":
        family, prefix = GaussianFamily(config), windows[:, : config.prefix_len]
        result["path_norms"] = {  # each model on the same noise draws: a generator of its own, seeded alike
            name: family.path_norms(m, prefix, args.steps_per_block, torch.Generator().manual_seed(NOISE_SEED))
            for name, m in models.items()
        }
    return result


def training_costs(trained: dict[str, dict], config: ModelConfig) -> dict:
    """Peak memory and step time of one block's trainer against the end-to-end one's (first family)."""
    block_train = [trained[f"{config.family} block {b}"] for b in range(config.n_blocks)]
    e2e_train = trained[f"{config.family} end-to-end"]
    block_peak = max(t["peak_train_memory_mb"] for t in block_train)
    block_step = statistics.median(t["median_step_s"] for t in block_train)
    return {
        "peak_train_memory_mb": {"one_block_max": block_peak, "end_to_end": e2e_train["peak_train_memory_mb"]},
        "peak_memory_ratio_block_over_end_to_end": block_peak / e2e_train["peak_train_memory_mb"],
        "median_step_s": {"one_block": block_step, "end_to_end": e2e_train["median_step_s"]},
        "step_time_ratio_block_over_end_to_end": block_step / e2e_train["median_step_s"],
    }


def summarize(configs: dict[str, ModelConfig], trained: list[dict], workdir: Path, corpus, args) -> dict:
    any_config = next(iter(configs.values()))
    windows = corpus.windows("validation", any_config).fixed(args.windows)
    known = vocabulary(corpus.train)
    judge = load_model_folder(workdir / "ar").modules[0].eval()
    ar = evaluate_autoregressive(judge, any_config, windows, known)
    ar["samples"] = text(generate_bytes(judge, windows[:SAMPLES, : any_config.prefix_len], any_config.gen_len,
                                        torch.Generator().manual_seed(0)), any_config)  # fmt: skip
    families = {family: evaluate_family(config, workdir, windows, judge, known, args)
                for family, config in configs.items()}
    ar_bpb = ar["bits_per_byte"]["overall"]
    for result in families.values():
        result["blocks_over_autoregressive"] = result["bits_per_byte"]["blocks"] / ar_bpb
    by_name = {t["name"]: t for t in trained}
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        # not a command-line option (the page renders settings as the command): each kind's own rate
        "learning_rates": {"denoiser": default_lr("block"), "autoregressive": default_lr("autoregressive")},
        "model": any_config.to_dict(),
        "default_family": ModelConfig().family,
        "best_family_by_blocks_bits_per_byte": min(families, key=lambda f: families[f]["bits_per_byte"]["blocks"]),
        "families": families,
        "autoregressive": ar,
        "true_continuations": text(windows[:SAMPLES, any_config.prefix_len :], any_config),
        "prefixes": text(windows[:SAMPLES, : any_config.prefix_len], any_config),
        # the same validation text through general-purpose compressors (swarm/model/compressors.py)
        "compressors": compressor_bits_per_byte(corpus.raw("validation"), corpus.raw("train")),
        "parameters": {t["name"]: t["parameters"] for t in trained},
        **training_costs(by_name, any_config),
        "curves": {t["name"]: t["curve"] for t in trained},  # (step, training seconds, bits per byte)
    }


def plot_curves(result: dict, configs: dict[str, ModelConfig], path: Path) -> None:
    """Bits per byte on the curve windows against steps: each family's blocks (the sum of their
    shares) and end-to-end model, and the autoregressive baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = result["curves"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for family, config in configs.items():
        parts = [curves[f"{family} block {b}"] for b in range(config.n_blocks)]
        steps = [point[0] for point in parts[0]]
        ax.plot(steps, [sum(p[i][2] for p in parts) for i in range(len(steps))], linewidth=2, label=f"{family}: blocks")
        s, _, bpb = zip(*curves[f"{family} end-to-end"])
        ax.plot(s, bpb, linestyle="--", label=f"{family}: end to end")
    s, _, bpb = zip(*curves["autoregressive"])
    ax.plot(s, bpb, linewidth=2, color="black", label="autoregressive (teacher-forced)")
    ax.set_xlabel("optimizer steps (each block, and each baseline)")
    ax.set_ylabel("validation bits per byte (masked: exact, leftmost; gaussian: ELBO)")
    ax.set_title("quality at equal compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_picture(path, fig, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300,
                        help="budget: optimizer steps for each block and each baseline")
    parser.add_argument("--families", default=",".join(FAMILIES), help="model families to compare, comma-separated")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--windows", type=int, default=256, help="validation windows for the figures")
    parser.add_argument("--steps-per-block", type=int, default=8, help="denoising steps per block at generation")
    parser.add_argument("--reveal", choices=REVEAL_ORDERS, default=Sampling.reveal, help="the masked sampler's "
                        "reveal order (swarm/model/steps.py)")  # fmt: skip
    parser.add_argument("--curve-points", type=int, default=6, help="validation points on each training curve")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--config", default=None, help="model config JSON (default: the built-in config)")
    parser.add_argument("--device", default="cpu",
                        help="where each model trains (cpu, cuda); every figure is computed on the host")
    parser.add_argument("--out", default="benchmarks/results/quality", help="folder for quality.json and quality.png")
    args = parser.parse_args()
    setup_logging()
    config = ModelConfig.from_json_file(args.config)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if not families or any(f not in FAMILIES for f in families):
        parser.error(f"--families takes names among {', '.join(FAMILIES)}")
    try:
        checked_device(args.device)
    except SwarmError as error:
        parser.error(str(error))
    configs = {family: family_config(config, family) for family in families}
    corpus = load_corpus()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        trained = run_jobs(make_jobs(configs, corpus, args, Path(tmp)), initializer=setup_logging)
        result = summarize(configs, trained, Path(tmp), corpus, args)
    result["wall_s"] = time.time() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "quality.json", json.dumps(result, indent=2).encode())
    plot_curves(result, configs, out / "quality.png")
    print(json.dumps({k: v for k, v in result.items() if k != "curves"}, indent=2))


if __name__ == "__main__":
    main()
