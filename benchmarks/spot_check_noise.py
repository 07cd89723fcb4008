"""How many windows a spot check needs: the standard error of the score difference between two
checkpoints of one block, measured on private windows and draws (swarm/checkpoints/spot_check.py).

One block of the built-in config (the last, the least masked) is trained for --steps, and its
weights kept at --steps - --apart and at --steps (a save apart at the peer's default). For each
window count, --repeats spot checks (each with its own private seeds, as every fetch, joiner and
client draws them) measure both; the standard deviation of their score differences is the
standard error of one check's comparison at that count. Also: the seconds one measurement takes.

    python benchmarks/spot_check_noise.py                   # about 8 minutes on 2 busy cores
    python benchmarks/spot_check_noise.py --steps 40 --apart 20 --repeats 3 --counts 16 32 --out /tmp/noise
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from swarm.checkpoints.spot_check import SpotCheck
from swarm.files import write_atomic
from swarm.model.data import load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.train import TrainConfig, block_trainer, train


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=350)
    parser.add_argument("--apart", type=int, default=50, help="steps between the two checkpoints compared")
    parser.add_argument("--repeats", type=int, default=30, help="private spot checks per window count")
    parser.add_argument("--counts", type=int, nargs="+", default=[32, 64, 128, 256, 512], help="windows per source")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/spot_check_noise")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    config, corpus = ModelConfig(), load_corpus(None)
    block = config.n_blocks - 1
    trainer = block_trainer(config, block, corpus.windows("train", config), TrainConfig(steps=args.steps))
    started = time.perf_counter()
    train(trainer, args.steps - args.apart)
    older = copy.deepcopy(trainer.module)
    train(trainer, args.apart)
    training_s = time.perf_counter() - started
    rows = {}
    for count in args.counts:
        differences, by_source, scores, seconds = [], {}, [], []
        for _ in range(args.repeats):
            check = SpotCheck.from_corpus(corpus, config, count=count)  # private seeds, as every caller's
            old, new = check.losses(older, config, block), check.losses(trainer.module, config, block)
            differences.append(new.score - old.score)
            for source, loss in new.by_source.items():
                by_source.setdefault(source, []).append(loss - old.by_source[source])
            scores.append(new.score)
            seconds.append(check.seconds / 2)
        rows[count] = {"mean_difference": statistics.mean(differences), "se_difference": statistics.stdev(differences),
                       "se_difference_by_source": {s: statistics.stdev(d) for s, d in by_source.items()},
                       "se_score": statistics.stdev(scores), "mean_score": statistics.mean(scores),
                       "seconds_per_measure": statistics.median(seconds)}  # fmt: skip
        print(count, json.dumps(rows[count]), flush=True)
    result = {"config": "built-in", "block": block, "steps": args.steps, "apart": args.apart, "repeats": args.repeats,
              "threads": args.threads, "training_seconds": training_s, "windows_per_source": rows}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "spot_check_noise.json", json.dumps(result, indent=2).encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
