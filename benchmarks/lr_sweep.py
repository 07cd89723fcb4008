"""The recipe, side by side at equal CPU time: learning rate, units, tied embeddings, batch, noise draws.

Trains every block of the model once per variant, each block alone for --cpu-seconds of this
process's CPU time (all its threads together; CPU time, not wall time, so that another job on
the machine slows a variant down without cutting its budget; one thread by default, because
torch's threads spin while they wait for a busy core, burning CPU time that does no work, which
was seen here as 32 against 166 steps in the same CPU time), on the peer's schedule (warm-up,
then a cosine to a tenth over the steps that fit in that time, estimated from the first steps),
and scores the whole model on the same
validation windows: bits per byte (the ELBO, each noise level by the block that owns it). A
variant changes the built-in config or the training settings:

- `lr=`, `batch_size=`, `stratified_noise=`: swarm/model/train.py's TrainConfig;
- `vocab=N`: a byte-level BPE of N units trained here on the training split (what a swarm's
  creator does once; units.py), in place of the built-in tokenizer; `vocab=256`: raw bytes;
- any other key: a ModelConfig field (`tie_embeddings=false`, `prefix_len=24`, ...).

Equal CPU time, not equal steps: a variant whose step costs more takes fewer of them, as a
peer would. Writes lr_sweep.json and lr_sweep.png under --out.

    python benchmarks/lr_sweep.py --cpu-seconds 45        # the default variants, about 25 minutes
    python benchmarks/lr_sweep.py --cpu-seconds 10 --variants 'default:;lr 1e-3:lr=1e-3'
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import torch

from swarm.cli.console import setup_logging
from swarm.files import write_atomic, write_picture
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.evaluate import elbo_bits_per_byte
from swarm.model.train import TrainConfig, block_trainer
from swarm.model.units import add_tokenizer, train_tokenizer

logger = logging.getLogger("benchmarks.lr_sweep")

DEFAULT_VARIANTS = ";".join([
    "default:",
    "lr 1e-3:lr=1e-3",
    "lr 2e-3:lr=2e-3",
    "stratified t:stratified_noise=true",
    "vocab 4096:vocab=4096",
    "untied embeddings:tie_embeddings=false",
    "batch 64:batch_size=64",
])  # fmt: skip
TRAIN_FIELDS = {"lr": float, "batch_size": int, "stratified_noise": lambda v: v.lower() == "true"}
TIMING_STEPS = 5  # steps that time a block before its schedule is set


def parse_variants(text: str) -> list[tuple[str, dict[str, str]]]:
    """'name:key=value,key=value;name:...' -> [(name, {key: value})]."""
    variants = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, settings = part.partition(":")
        pairs = [s.split("=", 1) for s in settings.split(",") if s.strip()]
        variants.append((name.strip(), {k.strip(): v.strip() for k, v in pairs}))
    return variants


def variant_setup(settings: dict[str, str], corpus, base: TrainConfig) -> tuple[ModelConfig, TrainConfig]:
    """The model config and training settings a variant names (a tokenizer trained here for `vocab`)."""
    train = replace(base, **{k: TRAIN_FIELDS[k](v) for k, v in settings.items() if k in TRAIN_FIELDS})
    fields: dict = {k: json.loads(v.lower() if v.lower() in ("true", "false") else v)
                    for k, v in settings.items() if k not in TRAIN_FIELDS and k != "vocab"}  # fmt: skip
    if "vocab" in settings:
        vocab = int(settings["vocab"])
        if vocab == 256:
            fields.update(vocab_size=256, tokenizer=None, tie_embeddings=False)
        else:
            texts = [t for t in corpus.train_documents["text"] if t]
            units = add_tokenizer(train_tokenizer(texts, vocab), keep=False)
            fields.update(vocab_size=units.vocab_size, tokenizer=units.sha256)
    return ModelConfig.from_dict({**ModelConfig().to_dict(), **fields}), train


def train_for(config: ModelConfig, block: int, windows, train: TrainConfig,
              seconds: float) -> tuple[torch.nn.Module, int]:
    """Block `block` trained for `seconds` of CPU time on a schedule sized to the steps that fit."""
    timing = block_trainer(config, block, windows, train)
    started = time.process_time()
    for _ in range(TIMING_STEPS):
        timing.step()
    per_step = (time.process_time() - started) / TIMING_STEPS
    steps = max(train.warmup_steps + 1, int(seconds / per_step))
    trainer = block_trainer(config, block, windows, replace(train, steps=steps))
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        trainer.step()
    return trainer.module.eval(), trainer.step_count


def run_variant(name: str, settings: dict[str, str], corpus, args) -> dict:
    config, train = variant_setup(settings, corpus, TrainConfig(batch_size=args.batch_size))
    windows = corpus.windows("train", config)
    validation = corpus.windows("validation", config).fixed(args.windows)
    blocks, steps = zip(*[train_for(config, b, windows, train, args.cpu_seconds) for b in range(config.n_blocks)])
    bpb = elbo_bits_per_byte(lambda b: blocks[b], config, validation)
    logger.info("%s: %.3f bits per byte after %s steps", name, bpb["overall"], list(steps))
    return {"name": name, "settings": settings, "bits_per_byte": bpb["overall"], "per_block": bpb["per_block"],
            "steps": list(steps), "lr": train.lr, "batch_size": train.batch_size, "vocab_size": config.vocab_size,
            "tie_embeddings": config.tie_embeddings, "stratified_noise": train.stratified_noise}  # fmt: skip


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["variants"]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    ax.barh([r["name"] for r in rows], [r["bits_per_byte"] for r in rows])
    for i, r in enumerate(rows):
        ax.text(r["bits_per_byte"], i, f" {r['bits_per_byte']:.3f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"validation bits per byte ({result['settings']['windows']} windows)")
    ax.set_title(f"recipe variants: each block {result['settings']['cpu_seconds']:g} CPU seconds")
    fig.tight_layout()
    write_picture(path, fig, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-seconds", type=float, default=45.0, help="CPU time each block trains, per variant")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="'name:key=value,...;name:...'")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--windows", type=int, default=256, help="validation windows scored")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: see the module docstring)")
    parser.add_argument("--out", default="benchmarks/results/lr_sweep")
    args = parser.parse_args()
    setup_logging()
    torch.set_num_threads(args.threads)
    corpus = load_corpus()
    rows = [run_variant(name, settings, corpus, args) for name, settings in parse_variants(args.variants)]
    result = {"settings": {k: v for k, v in vars(args).items()}, "variants": rows,
              "best": min(rows, key=lambda r: r["bits_per_byte"])["name"]}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "lr_sweep.json", json.dumps(result, indent=2).encode())
    plot(result, out / "lr_sweep.png")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
