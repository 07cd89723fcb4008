"""What the demo's start model writes: the blocks the package ships, scored as long_run.py scores its blocks.

`swarm-demo` starts its peers from the blocks in swarm/cli/demo_start (an earlier demo swarm's,
trained for thousands of steps per block; its manifest.json says how) and trains on from them.
This scores those blocks on the long run's validation windows (bits per byte, the share of
written words that are words of the training text, and distinct words) and writes samples after
the long run's prompts, so that what the README says the demo writes comes from a results file.
No autoregressive judge or baseline here: one at the start model's steps would take hours of
these 2 cores (long_run.py's took 26 minutes for 819 steps), so `gen_nll` is left out.

    python benchmarks/start_model.py        # about 3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from long_run import PROMPTS, samples

from swarm.cli.console import setup_logging
from swarm.cli.demo import SHIPPED_START, StartModel
from swarm.model.checkpoint import write_atomic
from swarm.model.data import ByteWindows, load_corpus
from swarm.model.evaluate import evaluate_denoiser
from swarm.model.steps import REVEAL_ORDERS, Sampling
from swarm.model.words import vocabulary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=256, help="validation windows for the figures (the long run's)")
    parser.add_argument("--steps-per-block", type=int, default=8, help="denoising steps per block at generation")
    parser.add_argument("--temperature", type=float, default=0.0, help="of the samples (0: argmax)")
    parser.add_argument("--reveal", choices=REVEAL_ORDERS, default=Sampling.reveal, help="the sampler's reveal order")
    parser.add_argument("--sample-bytes", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/results/start_model")
    args = parser.parse_args()
    setup_logging()
    start = StartModel.load(SHIPPED_START)
    config, corpus = start.model.config, load_corpus()
    windows = ByteWindows(corpus.validation, config.seq_len).fixed(args.windows)
    figures = evaluate_denoiser(start.model.denoiser_for_block, config, windows, args.steps_per_block,
                                known_words=vocabulary(corpus.train), sampling=Sampling(reveal=args.reveal))  # fmt: skip
    result = {
        "settings": vars(args),
        "model": config.to_dict(),
        "start_model": str(SHIPPED_START.relative_to(Path(__file__).resolve().parent.parent)),
        "made_by": start.model.manifest.get("made_by"),
        "block_steps": start.steps,
        "figures": figures,
        "samples": {"prompts": PROMPTS, "blocks": samples(start.model.denoiser_for_block, config, args)},
    }
    out = Path(args.out)
    write_atomic(out / "start_model.json", json.dumps(result, indent=2).encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
