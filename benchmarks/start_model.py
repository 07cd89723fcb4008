"""What the demo's start model writes: the blocks the package ships, scored as long_run.py scores its blocks.

`swarm-demo` starts its peers from the blocks in swarm/cli/demo_start (an earlier demo swarm's,
trained for thousands of steps per block; its manifest.json says how) and trains on from them.
This scores those blocks on the long run's validation windows (bits per byte beside the
compressors' on the same text, the share of written words that are words of the training text,
distinct words and word entropy) under each reveal order of the sampler, and writes samples after
the long run's validation passages beside their true continuations, so that what the README says
the demo writes comes from a results file. With `--judge`, an autoregressive model folder
(`swarm-train --kind autoregressive`), it also gives `gen_nll`: the judge's NLL of the writing
over the true continuation's. It gives `prompt_influence` (swarm/model/evaluate.py) for the blocks,
and for the judge where one is given: how much the prompt steers each, 1.0 for a model that ignores
it. `--prompt-influence-only` scores that figure alone into the results file already in --out.

    swarm-train --kind autoregressive --steps 800 --out ar_judge     # about 26 minutes on 2 cores
    python benchmarks/start_model.py --judge ar_judge                  # about 3 minutes
    python benchmarks/start_model.py --prompt-influence-only           # under a minute
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from long_run import by_reveal, by_temperature, sample_texts

from swarm.cli.console import setup_logging
from swarm.cli.demo import SHIPPED_START, StartModel
from swarm.files import write_atomic
from swarm.model.checkpoint import encode_block, load_model_folder
from swarm.model.compressors import compressor_bits_per_byte
from swarm.model.data import load_corpus
from swarm.model.denoiser import count_parameters
from swarm.model.evaluate import (
    bits_per_byte,
    evaluate_autoregressive,
    evaluate_denoiser,
    far_partners,
    prompt_influence,
)
from swarm.model.steps import REVEAL_ORDERS, Sampling
from swarm.model.words import vocabulary


def block_facts(start: StartModel) -> dict:
    """What one block is, for a peer that would host it: its parameters, its checkpoint's bytes (float32,
    as peers save and send it) and the shipped folder's bytes (all blocks, bfloat16)."""
    module, config = start.model.modules[0], start.model.config
    return {"parameters": count_parameters(module),
            "checkpoint_bytes": len(encode_block(module.float(), config, 0, start.steps[0])),
            "shipped_bytes": sum(p.stat().st_size for p in start.folder.iterdir() if p.is_file())}  # fmt: skip


def prompt_figures(start: StartModel, judge, corpus, args) -> dict:
    """`prompt_influence` of the blocks, and of the judge (None without one), on the validation windows
    of the other figures, each continuation also after the prompt of the window half the windows away
    in the stream (`far_partners`: the closest such pair is `partners_apart_min_units` apart)."""
    config, windows_of = start.model.config, corpus.windows("validation", start.model.config)
    starts = windows_of.fixed_starts(args.windows)
    windows, partners = windows_of.at(starts), far_partners(starts)

    def influence(bits) -> dict:
        return prompt_influence(bits, windows, partners, config.prefix_len)

    blocks = influence(lambda w: bits_per_byte(start.model.denoiser_for_block, config, w)["overall"])
    ar = None
    if judge is not None:
        ar = influence(lambda w: evaluate_autoregressive(judge, config, w)["bits_per_byte"]["overall"])
    made_by = {"windows": args.windows, "judge": judge_name(args), "prompt_influence_only": args.prompt_influence_only}
    apart = int((starts - starts[partners]).abs().min())
    return {"command": made_by, "partners_apart_min_units": apart, "blocks": blocks, "autoregressive": ar}


def add_prompt_influence(out: Path, figures: dict) -> None:
    """Put `figures` into the results file already in `out` as its prompt_influence, the rest as it is."""
    result = {**json.loads((out / "start_model.json").read_text()), "prompt_influence": figures}
    write_atomic(out / "start_model.json", json.dumps(result, indent=2).encode())
    print(json.dumps(figures, indent=2))


def judge_name(args: argparse.Namespace) -> str | None:
    """The judge's folder by its name, not a path (a results file says nothing of this machine)."""
    return Path(args.judge).name if args.judge else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=256, help="validation windows for the figures (the long run's)")
    parser.add_argument("--steps-per-block", type=int, default=8, help="denoising steps per block at generation")
    parser.add_argument("--temperature", type=float, default=Sampling.temperature,
                        help="of the samples (default: the sampler's, what a user gets; 0: argmax)")
    parser.add_argument("--reveal", choices=REVEAL_ORDERS, default=Sampling.reveal, help="the sampler's reveal order")
    parser.add_argument("--sample-bytes", type=int, default=128)
    parser.add_argument("--judge", default=None, help="an autoregressive model folder: gen_nll under it")
    parser.add_argument("--out", default="benchmarks/results/start_model")
    parser.add_argument("--prompt-influence-only", action="store_true", help="score prompt_influence alone into "
                        "the start_model.json already in --out, its other figures left as they are")  # fmt: skip
    args = parser.parse_args()
    setup_logging()
    start = StartModel.load(SHIPPED_START)
    config, corpus = start.model.config, load_corpus()
    judged = load_model_folder(args.judge) if args.judge else None
    if judged is not None and judged.kind != "autoregressive":
        raise SystemExit(f"--judge {args.judge} holds a {judged.kind} model, not an autoregressive one")
    judge = judged.modules[0] if judged else None
    out = Path(args.out)
    if args.prompt_influence_only:
        add_prompt_influence(out, prompt_figures(start, judge, corpus, args))
        return
    windows = corpus.windows("validation", config).fixed(args.windows)
    known, blocks = vocabulary(corpus.train), start.model.denoiser_for_block
    figures = evaluate_denoiser(
        blocks, config, windows, args.steps_per_block, judge, known, Sampling(args.temperature, args.reveal)
    )
    written = {order: sample_texts({"blocks": blocks}, config, corpus,
                                   argparse.Namespace(**{**vars(args), "reveal": order}))
               for order in REVEAL_ORDERS}  # fmt: skip
    result = {
        "settings": {**vars(args), "judge": judge_name(args)},
        "judge": None if judged is None else {"kind": judged.kind, "steps": (judged.manifest or {}).get("steps")},
        "model": config.to_dict(),
        "start_model": str(SHIPPED_START.relative_to(Path(__file__).resolve().parent.parent)),
        "made_by": start.model.manifest.get("made_by"),
        "block_steps": start.steps,
        "block": block_facts(start),
        "figures": figures,
        "prompt_influence": prompt_figures(start, judge, corpus, args),
        "by_reveal": by_reveal(blocks, config, windows, judge, known, args),
        "by_temperature": by_temperature(blocks, config, windows, judge, known, args),
        "samples": {"prompts": written[args.reveal]["prompts"], "true": written[args.reveal]["true"],
                    **{order: w["blocks"] for order, w in written.items()}},
        "compressors": compressor_bits_per_byte(corpus.raw("validation"), corpus.raw("train")),
    }
    write_atomic(out / "start_model.json", json.dumps(result, indent=2).encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
