"""A long run through the swarm itself, against the end-to-end and autoregressive baselines at equal compute.

Starts a bootstrap node and one `swarm-peer` per block (real processes, real P2P on
127.0.0.1, one thread each), lets them train for --minutes of wall time, fetching the
assembled model with `swarm-fetch` now and then for the curve, and once more at the end. Then
it trains the end-to-end denoiser and the autoregressive baseline at equal compute: as many
optimizer steps as the blocks took (their mean), the same batch size and schedule as a
peer's, each at its kind's own learning rate (swarm/model/train.py's `default_lr`: the
end-to-end denoiser at the blocks' rate), each in its own process, one after the other. All three are scored on
the same validation windows: bits per byte (of the masked blocks, the exact likelihood of left-to-right writing,
beside their ELBO; the teacher-forced cross-entropy of AR) beside gzip's, bzip2's and xz's on the same
validation text (and xz's after
reading the training text), the sample figures (real words, distinct words, word entropy,
beside the true text's and AR's), gen_nll under the AR model as judge (beside the true
continuation's), and samples after validation passages' openings beside their true continuations. Writes
long_run.json and long_run.png (bits per byte against steps) under --out.

Each peer runs `--sync none` (AdamW alone, as the baselines): with one peer per block there
are no replicas to keep in step.

    python benchmarks/long_run.py                # about 70 minutes on 2 cores
    python benchmarks/long_run.py --minutes 2    # a quick look
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import torch

from swarm.cli.console import setup_logging
from swarm.cli.demo import save_start_model
from swarm.files import write_atomic, write_picture
from swarm.lab.launch import LocalSwarm
from swarm.lab.trainjobs import run_jobs
from swarm.model.autoregressive import generate_bytes
from swarm.model.checkpoint import load_model_folder
from swarm.model.compressors import compressor_bits_per_byte
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import (
    bits_per_byte,
    evaluate_autoregressive,
    evaluate_denoiser,
    generate_for_windows,
    judge_nll,
    word_figures,
)
from swarm.model.families import local_runner
from swarm.model.generate import continue_text, prefix_tensor
from swarm.model.steps import REVEAL_ORDERS, Sampling
from swarm.model.train import default_lr
from swarm.model.words import vocabulary
from swarm.waiting import wait_for

logger = logging.getLogger("benchmarks.long_run")

TEMPERATURES = (0.0, 0.5, 0.8, 1.0)  # of the sampler, for the sample figures side by side (`by_temperature`)
SAMPLES = 5  # validation passages written on: the same prompts for every model, beside their true continuations
SCHEDULE_STEPS = 3000  # the cosine schedule of peers and baselines: about the steps a block takes in 25 minutes here
CURVE_WINDOWS = 64


def swarm_phase(args, config_path: Path, config: ModelConfig, workdir: Path, curve_windows: torch.Tensor) -> dict:
    """Train through the swarm for --minutes; fetch for the curve and at the end. Returns the last
    fetched model's folder, its blocks' steps, and the curve (seconds, mean step, bits per byte).
    A fetch that fails is logged and left out of the curve; the run fails only if none succeeds."""
    names = [f"block{b}" for b in range(config.n_blocks)]
    extra = ["--sync", "none", "--save-every", str(args.save_every), "--announce-period", "5",
             "--batch-size", str(args.batch_size), "--max-steps", str(args.schedule_steps)]  # fmt: skip
    curve, fetched_folder, steps = [], None, []
    with LocalSwarm(workdir, swarm="longrun", config_path=str(config_path)) as local:
        local.start_bootstrap(refresh_period=5)
        for b, name in enumerate(names):
            local.start_peer(name, block=str(b), extra=extra)
        wait_for(lambda: local.check_running() or training(local, names), 600, "every block's peer training", 5.0)
        started = time.monotonic()
        for k in range(1, args.curve_points + 1):
            time.sleep(max(0.0, started + args.minutes * 60 * k / args.curve_points - time.monotonic()))
            local.check_running()
            folder = workdir / f"fetch{k}"
            fetched = local.run("swarm-fetch", "--out", str(folder), timeout=600)
            if fetched.returncode != 0:
                logger.warning("fetch %d failed, left out of the curve: %s", k, fetched.stderr.strip()[-500:])
                continue
            model, fetched_folder = load_model_folder(folder), folder
            steps = [model.manifest["blocks"][str(b)]["step"] for b in range(config.n_blocks)]
            bpb = bits_per_byte(model.denoiser_for_block, config, curve_windows)["overall"]
            curve.append((time.monotonic() - started, sum(steps) / len(steps), bpb))
            logger.info("after %.0f s: blocks at steps %s, %.3f bits per byte", curve[-1][0], steps, bpb)
    if fetched_folder is None:
        raise RuntimeError("every swarm-fetch failed")
    return {"folder": fetched_folder, "steps": steps, "curve": curve, "seconds": time.monotonic() - started}


def training(local: LocalSwarm, names: list[str]) -> bool:
    """Whether every peer of `names` has joined and trains."""
    rows = {r["public_name"]: r for r in local.status_rows()}
    return all(rows.get(n, {}).get("state") == "training" for n in names)


def samples(denoiser_for_block, config: ModelConfig, args, prompts: list[str]) -> list[str]:
    runner = local_runner(denoiser_for_block, config)
    return [b"".join(continue_text(runner, config, p, args.sample_bytes, args.steps_per_block,
                                   Sampling(args.temperature, args.reveal), seed=1)).decode("utf-8", errors="replace")
            for p in prompts]  # fmt: skip


def ar_samples(model, config: ModelConfig, args, prompts: list[str]) -> list[str]:
    """The autoregressive model's continuations: as many units as bytes asked (a unit holds at least
    one), the bytes of them cut to --sample-bytes."""
    generator, units = torch.Generator().manual_seed(1), config.units()
    written = [generate_bytes(model, prefix_tensor(p, config), args.sample_bytes, generator, args.temperature)[0]
               for p in prompts]  # fmt: skip
    return [units.decode(w.tolist())[: args.sample_bytes].decode("utf-8", errors="replace") for w in written]


def sample_texts(models: dict, config: ModelConfig, corpus, args) -> dict:
    """Each model's continuations of SAMPLES validation passages' openings, beside the true ones
    ("autoregressive" is a ByteTransformer, the others denoisers by block)."""
    passages = corpus.passages("validation", SAMPLES, continuation_chars=args.sample_bytes)
    prompts = [prompt for prompt, _ in passages]
    written = {name: (ar_samples if name == "autoregressive" else samples)(m, config, args, prompts)
               for name, m in models.items()}  # fmt: skip
    return {"prompts": prompts, "true": [truth for _, truth in passages], **written}


def plot(result: dict, path: Path) -> None:
    """Bits per byte against optimizer steps (a block's, or a baseline's): equal compute at equal steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, label in (("blocks", "blocks, through the swarm (mean step of the fetched blocks)"),
                        ("end_to_end", "end to end"),
                        ("autoregressive", "autoregressive (teacher-forced)")):  # fmt: skip
        steps, bpb = zip(*[(point[1], point[2]) for point in result["curves"][name]])
        ax.plot(steps, bpb, marker="o", markersize=3, label=label)
    ax.set_xlabel("optimizer steps (each block, and each baseline)")
    ax.set_ylabel(f"validation bits per byte ({CURVE_WINDOWS} windows)")
    ax.set_title(f"long run: {result['model']['n_blocks']} blocks at {result['steps_each']} steps each, "
                 "baselines at equal steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_picture(path, fig, dpi=120)


def score(config: ModelConfig, workdir: Path, blocks_folder: Path, corpus, args) -> dict:
    """The figures of the fetched model and both baselines (kept under `workdir`), and samples."""
    known = vocabulary(corpus.train)
    windows = corpus.windows("validation", config).fixed(args.windows)
    blocks = load_model_folder(blocks_folder)
    e2e = load_model_folder(workdir / "e2e").modules[0].eval()
    judge = load_model_folder(workdir / "ar").modules[0].eval()
    figures = {
        "blocks": evaluate_denoiser(blocks.denoiser_for_block, config, windows, args.steps_per_block, judge, known,
                                    Sampling(args.temperature, args.reveal)),
        "end_to_end": evaluate_denoiser(lambda _: e2e, config, windows, args.steps_per_block, judge, known,
                                        Sampling(args.temperature, args.reveal)),
        "autoregressive": evaluate_autoregressive(judge, config, windows, known),
    }
    bpb = {name: f["bits_per_byte"]["overall"] for name, f in figures.items()}
    return {
        "figures": figures,
        "bits_per_byte": bpb,
        "blocks_over_end_to_end": bpb["blocks"] / bpb["end_to_end"],
        "blocks_over_autoregressive": bpb["blocks"] / bpb["autoregressive"],
        "gen_nll_over_true": figures["blocks"]["gen_nll"] / figures["blocks"]["true_nll"],
        "blocks_by_reveal": by_reveal(blocks.denoiser_for_block, config, windows, judge, known, args),
        "blocks_by_temperature": by_temperature(blocks.denoiser_for_block, config, windows, judge, known, args),
        "autoregressive_by_temperature": autoregressive_by_temperature(judge, config, windows, known),
        "samples": sample_texts({"blocks": blocks.denoiser_for_block, "end_to_end": lambda _: e2e,
                                 "autoregressive": judge}, config, corpus, args),  # fmt: skip
        # the same validation text through general-purpose compressors (swarm/model/compressors.py)
        "compressors": compressor_bits_per_byte(corpus.raw("validation"), corpus.raw("train")),
    }


def by_reveal(denoiser_for_block, config: ModelConfig, windows: torch.Tensor, judge, known, args) -> dict:
    """The blocks' writing under each reveal order of the sampler, side by side (at --temperature,
    the same draws); `gen_nll` over the true continuation's only with a judge."""
    true_nll = true_continuation_nll(judge, windows, config)
    return {reveal: sampler_row(denoiser_for_block, config, windows, judge, known, args,
                                Sampling(args.temperature, reveal), true_nll)
            for reveal in REVEAL_ORDERS}  # fmt: skip


def by_temperature(denoiser_for_block, config: ModelConfig, windows: torch.Tensor, judge, known, args) -> dict:
    """The blocks' writing at each of TEMPERATURES in --reveal order: argmax repeats itself, drawing
    writes more words and less likely ones; the sample targets ask for both at once."""
    true_nll = true_continuation_nll(judge, windows, config)
    return {str(t): sampler_row(denoiser_for_block, config, windows, judge, known, args, Sampling(t, args.reveal),
                                true_nll)
            for t in TEMPERATURES}  # fmt: skip


def autoregressive_by_temperature(model, config: ModelConfig, windows: torch.Tensor, known) -> dict:
    """The autoregressive model's own writing at each of TEMPERATURES: what the sample targets ask
    of the blocks, asked of a model that predicts the text better (no judge: it would judge itself)."""
    rows = {}
    for t in TEMPERATURES:
        words = evaluate_autoregressive(model, config, windows, known, temperature=t)
        rows[str(t)] = {**word_ratios(words), "real_words": words["real_words"]}
    return rows


def word_ratios(words: dict) -> dict:
    """`word_figures`' distinct-word share and word entropy over the true continuation's."""
    return {"distinct_over_true": words["distinct_words"] / words["true_distinct_words"],
            "entropy_over_true": words["word_entropy"] / words["true_word_entropy"]}  # fmt: skip


def true_continuation_nll(judge, windows: torch.Tensor, config: ModelConfig) -> float | None:
    """The judge's NLL of the windows' true continuations (None without a judge): once per table."""
    return None if judge is None else judge_nll(judge, windows, windows[:, config.prefix_len :], config)


def sampler_row(denoiser_for_block, config: ModelConfig, windows: torch.Tensor, judge, known, args,
                sampling: Sampling, true_nll: float | None) -> dict:  # fmt: skip
    """The sample figures of what the blocks write with `sampling`, and the ratios to the true
    text's that the targets name (`true_nll`: `true_continuation_nll`)."""
    written, _ = generate_for_windows(denoiser_for_block, config, windows, args.steps_per_block, sampling)
    words = word_figures(windows, written, config, known)
    row = {**{k: words[k] for k in ("real_words", "distinct_words", "word_entropy")}, **word_ratios(words)}
    if judge is not None:
        row["gen_nll_over_true"] = judge_nll(judge, windows, written, config) / true_nll
    return row


def train_all(config: ModelConfig, workdir: Path, corpus, args) -> tuple[dict, Path]:
    """The swarm's run, then both baselines at equal compute: what was run, and the fetched model's folder."""
    curve_windows = corpus.windows("validation", config).fixed(CURVE_WINDOWS, seed=7)
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config.to_dict()))
    swarm = swarm_phase(args, config_path, config, workdir / "swarm", curve_windows)
    steps = round(sum(swarm["steps"]) / len(swarm["steps"]))
    common = {"config": config.to_dict(), "train": corpus.stream("train", config.units()),
              "validation": corpus.stream("validation", config.units()),
              "train_config": {"steps": args.schedule_steps, "batch_size": args.batch_size, "seed": 0},
              "run_steps": steps, "threads": args.threads, "curve_every": max(1, steps // 8)}  # fmt: skip
    trained = run_jobs([{**common, "kind": "end_to_end", "name": "end-to-end", "save_to": str(workdir / "e2e")},
                        {**common, "kind": "autoregressive", "name": "autoregressive", "save_to": str(workdir / "ar")}],
                       initializer=setup_logging)  # fmt: skip
    run = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("keep", "rescore", "save_start")},
        "swarm": {"peers": config.n_blocks, "sync": "none"},  # not options: one peer per block, no replicas to sync
        # not a command-line option (the page renders settings as the command): each kind's own rate
        "learning_rates": {"denoiser": default_lr("block"), "autoregressive": default_lr("autoregressive")},
        "model": config.to_dict(),
        "swarm_seconds": swarm["seconds"],
        "block_steps": swarm["steps"],
        "steps_each": steps,
        "fetched": str(swarm["folder"].relative_to(workdir)),  # the scored model's folder under --keep
        "baseline_train_seconds": {t["name"]: t["train_seconds"] for t in trained},
        "curves": {"blocks": swarm["curve"], "end_to_end": [(s, st, b) for st, s, b in trained[0]["curve"]],
                   "autoregressive": [(s, st, b) for st, s, b in trained[1]["curve"]]},  # fmt: skip
    }
    return run, swarm["folder"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=25.0, help="wall time the swarm trains")
    parser.add_argument("--config", default=None, help="model config JSON (default: the built-in config)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--schedule-steps", type=int, default=SCHEDULE_STEPS, help="the cosine schedule's length "
                        "for peers and baselines (a peer stops there: --max-steps)")  # fmt: skip
    parser.add_argument("--save-every", type=int, default=25, help="the peers' checkpoint period (steps)")
    parser.add_argument("--curve-points", type=int, default=5, help="fetches of the swarm's model while it trains")
    parser.add_argument("--windows", type=int, default=256, help="validation windows for the figures")
    parser.add_argument("--steps-per-block", type=int, default=8, help="denoising steps per block at generation")
    parser.add_argument("--temperature", type=float, default=Sampling.temperature,
                        help="of the samples (default: the sampler's, what a user gets; 0: argmax)")
    parser.add_argument("--reveal", choices=REVEAL_ORDERS, default=Sampling.reveal, help="the masked sampler's "
                        "reveal order (swarm/model/steps.py), of the samples and the figures")  # fmt: skip
    parser.add_argument("--sample-bytes", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="of each baseline's training")
    parser.add_argument("--out", default="benchmarks/results/long_run")
    parser.add_argument("--keep", default=None, help="keep the trained models (and the swarm's files) in this folder")
    parser.add_argument("--save-start", default=None, help="also write the swarm's fetched model here as the demo's "
                        "start model (bfloat16; swarm/cli/demo_start is the shipped one)")  # fmt: skip
    parser.add_argument("--rescore", default=None, help="train nothing: score again the models a run kept in this "
                        "folder (--keep), into the long_run.json already in --out")  # fmt: skip
    args = parser.parse_args()
    setup_logging()
    config = ModelConfig.from_json_file(args.config)
    corpus = load_corpus()
    out = Path(args.out)
    if args.rescore:
        workdir = Path(args.rescore)
        run = json.loads((out / "long_run.json").read_text())
        scoring = {k: getattr(args, k) for k in ("windows", "steps_per_block", "temperature", "reveal", "sample_bytes")}
        run["settings"] = {**run["settings"], **scoring}  # how the kept models were scored now
        result = {**run, "rescored": True, **score(config, workdir, workdir / run["fetched"], corpus, args)}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(args.keep or tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            run, fetched = train_all(config, workdir, corpus, args)
            result = {**run, **score(config, workdir, fetched, corpus, args)}
            if args.save_start:
                how = (f"the blocks of `python benchmarks/long_run.py --minutes {args.minutes:g} --schedule-steps "
                       f"{args.schedule_steps}`: a swarm of {config.n_blocks} swarm-peer processes, one per block, on "
                       "this machine's 2 cores")  # fmt: skip
                card = {"how": how, "steps": run["steps_each"], "replicas": 1, "data": "built-in",
                        "started_from": "nothing"}
                save_start_model(fetched, Path(args.save_start), card)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "long_run.json", json.dumps(result, indent=2).encode())
    plot(result, out / "long_run.png")
    print(json.dumps({k: v for k, v in result.items() if k != "curves"}, indent=2))


if __name__ == "__main__":
    main()
