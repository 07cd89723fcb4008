"""The model's quality: the families beside the baselines, the recipe at equal CPU time, the long run
through the swarm, and the demo's start model."""

from __future__ import annotations

from .formatting import DASH, code, command, fixed, parts, percent, plain, section, settings, size, table, times, yes
from .reading import Folder, Node


def quality(folder: Folder) -> list[str]:
    q = folder.json("quality.json")
    families, ar, params = q["families"], q["autoregressive"], q["parameters"]
    rows = [quality_row(f"{family}: {name}", part["figures"][name], part.get("path_norms"), name)
            for family, part in families.items() for name in ("blocks", "end_to_end")]  # fmt: skip
    rows.append(["autoregressive", fixed(ar["bits_per_byte"].num("overall")), percent(ar.num("real_words")),
                 percent(ar.num("distinct_words")), DASH, DASH, DASH, DASH])  # fmt: skip
    first = families[families.names()[0]]["figures"]["blocks"]
    rows.append(["true continuation", DASH, percent(first.num("true_real_words")),
                 percent(first.num("true_distinct_words")), fixed(first.num("true_nll")),
                 DASH, DASH, DASH])  # fmt: skip
    ratios = [f"{family}: blocks over end-to-end {times(part.num('blocks_over_end_to_end'))}, blocks over "
              f"autoregressive {times(part.num('blocks_over_autoregressive'))}"
              for family, part in families.items()]  # fmt: skip
    costs = (f"One block's trainer against the end-to-end one's: peak memory "
             f"{times(q.num('peak_memory_ratio_block_over_end_to_end'))}, step time "
             f"{times(q.num('step_time_ratio_block_over_end_to_end'))}. Parameters: "
             + ", ".join(f"{name} {params.num(name):,}" for name in params.names()) + ".")  # fmt: skip
    header = ["model", "bits per byte", "real words", "distinct words", "gen_nll", "chain_ce", "denoise_ce",
              "chain's path norms"]  # fmt: skip
    texts = {"prefix": q["prefixes"].data, "true": q["true_continuations"].data, "autoregressive": ar["samples"].data}
    for family, part in families.items():
        texts.update({f"{family}: {name}": part["samples"][name].data for name in part["samples"].names()})
    return section(
        "Trains each family's blocks (each as many steps as the end-to-end model) and end-to-end model, and the "
        "autoregressive baseline, on the built-in corpus, each in its own process, and scores them on the same "
        f"validation windows: bits per byte ({diffusion_likelihood(families, first)}, the autoregressive model's "
        "teacher-forced cross-entropy), the share of whole written words that are words of the training text, "
        "and in nats per "
        "byte `gen_nll` (the autoregressive judge's NLL of the written bytes), `chain_ce` and `denoise_ce`. The "
        "gaussian chain's path norms are where the chain hands each block its span over where training put "
        "it (1.0 = on the training path). Needs `pip install -e '.[bench]'`.",
        command("quality.py", q["settings"].data),
        settings(q["model"], label="Model"),
        table(header, rows),
        f"Bits per byte: {'; '.join(ratios)}. Default family: `{q['default_family']}`; lowest blocks' bits per "
        f"byte: `{q['best_family_by_blocks_bits_per_byte']}`. {reveal_order(q['settings'])}",
        compressors_line(q),
        plain(q.get("note") or ""),  # what changed since the run, where something did
        costs,
        samples(Node(texts, q.file)),
        folder.pictures(),
    )


def quality_row(label: str, figures: Node, path_norms: Node | None, name: str) -> list[str]:
    norms = DASH if path_norms is None else " ".join(f"{v:.2f}" for v in path_norms[name].data)
    return [label, fixed(figures["bits_per_byte"].num("overall")), percent(figures.get("real_words")),
            percent(figures.get("distinct_words")), fixed(figures.get("gen_nll")), fixed(figures.num("chain_ce")),
            fixed(figures["denoise_ce"].num("overall")), norms]  # fmt: skip


COMPRESSORS = {"gzip": "`gzip -9`", "bzip2": "`bzip2 -9`", "xz": "`xz -9e`",
               "xz_after_train": "`xz -9e` after reading the training text"}  # fmt: skip


def compressors_line(r: Node) -> str:
    """The compressors' bits per byte on the same validation text, where the run computed them."""
    if r.get("compressors") is None:
        return ""
    figures = ", ".join(f"{COMPRESSORS.get(name, name)} {fixed(value)}" for name, value in r["compressors"].items())
    return ("General-purpose compressors on the same validation text, in bits per byte (computed by the run): "
            f"{figures}.")


def lr_sweep(folder: Folder) -> list[str]:
    r = folder.json("lr_sweep.json")
    s = r["settings"]
    rows = [[plain(v["name"]), fixed(v.num("bits_per_byte")), plain(v["steps"]), plain(v.num("lr")),
             plain(v.num("batch_size")), plain(v.num("vocab_size")), yes(v["tie_embeddings"]),
             yes(v["stratified_noise"])] for v in r["variants"]]  # fmt: skip
    return section(
        "Variants of the recipe side by side at equal CPU time: every block of the built-in model trained alone "
        f"for {plain(s.num('cpu_seconds'))} CPU seconds per variant ({plain(s.num('threads'))} thread, so that "
        "another job on the machine cannot waste a variant's budget), on the peer's schedule sized to the steps "
        "that fit, then the whole model scored on the same validation windows. A variant of `vocab` trains its "
        "own byte-level BPE on the training split first.",
        command("lr_sweep.py", {**s.data, "variants": f"'{s['variants']}'"}),  # one shell word
        table(["variant", "bits per byte", "steps per block", "lr", "batch", "units", "tied", "stratified t"], rows),
        f"Best: `{r['best']}`.",
        plain(r.get("note") or ""),  # what changed since the run, where something did
        folder.pictures(),
    )


def long_run(folder: Folder) -> list[str]:
    r = folder.json("long_run.json")
    figures, bpb = r["figures"], r["bits_per_byte"]
    rows = []
    for name in ("blocks", "end_to_end", "autoregressive"):
        f = figures[name]
        rows.append([name.replace("_", "-"), fixed(bpb.num(name)), percent(f.get("real_words")),
                     percent(f.get("distinct_words")), fixed(f.get("gen_nll")), fixed(f.get("chain_ce"))])  # fmt: skip
    blocks = figures["blocks"]
    rows.append(["true continuation", DASH, percent(blocks.num("true_real_words")),
                 percent(blocks.num("true_distinct_words")), fixed(blocks.num("true_nll")), DASH])  # fmt: skip
    named = ("prompts", "true", "blocks", "end_to_end", "autoregressive")
    texts = {name: r["samples"][name].data for name in named if name in r["samples"].data}
    return section(
        "Trains the model through the swarm itself: a bootstrap node and one `swarm-peer` per block (real "
        "processes, real P2P on 127.0.0.1, the 2 cores shared), for a fixed wall time; assembles it with "
        "`swarm-fetch`; then trains the end-to-end and autoregressive baselines at equal compute (as many steps as "
        "the blocks took, one after the other) and scores all three on the same validation windows.",
        command("long_run.py", {k: v for k, v in r["settings"].data.items() if k not in SWARM_FACTS}),
        peers_line(r),
        plain(r.get("note") or ""),
        settings(r["model"], label="Model"),
        f"The blocks took {plain(r['block_steps'])} steps in {fixed(r.num('swarm_seconds') / 60, 1)} minutes of "
        f"the swarm's wall time; each baseline took {r['steps_each']} steps.",
        table(["model", "bits per byte", "real words", "distinct words", "gen_nll", "chain_ce"], rows),
        compressors_line(r),
        f"Blocks over end-to-end {times(r.num('blocks_over_end_to_end'))}, blocks over autoregressive "
        f"{times(r.num('blocks_over_autoregressive'))} (bits per byte{elbo_beside(blocks, ' of the blocks: ')}); the "
        "blocks' `gen_nll` over the true "
        f"continuation's {times(r.num('gen_nll_over_true'))}.",
        reveal_line(r),
        temperature_table(r, "blocks_by_temperature"),
        autoregressive_temperature_table(r),
        samples(Node(texts, r.file), "What each wrote after the first prompt:"),
        folder.pictures(),
    )


SWARM_FACTS = ("peers", "sync")  # what the swarm was, not options (older files kept them among the settings)


def peers_line(r: Node) -> str:
    """How many peers the run started and how they synced, wherever the results file keeps it."""
    facts = r["swarm"].data if "swarm" in r.data else r["settings"].data
    return f"The swarm: {plain(facts['peers'])} peers, one per block, each `--sync {facts['sync']}`."


def start_model(folder: Folder) -> list[str]:
    r = folder.json("start_model.json")
    f, made, judge = r["figures"], r["made_by"], r.get("judge")
    judged = judge is not None
    entropy = "word_entropy" in f.data
    rows = [[f"`{order}`" + (" (the figures' order)" if order == r["settings"]["reveal"] else ""),
             percent(row.num("real_words")), percent(row.num("distinct_words"))]
            + ([fixed(row.num("word_entropy"), 2)] if entropy else [])
            + ([times(row.num("gen_nll_over_true"))] if judged else [])
            for order, row in r["by_reveal"].items()]  # fmt: skip
    rows.append(["true continuation", percent(f.num("true_real_words")), percent(f.num("true_distinct_words"))]
                + ([fixed(f.num("true_word_entropy"), 2)] if entropy else [])
                + (["1.000x"] if judged else []))  # fmt: skip
    steps = "" if not judged or judge.get("steps") is None else f" of {plain(judge['steps'])} steps"
    judge_line = (f"The judge: the {judge['kind']} model{steps} given as `--judge`; `gen_nll` is its NLL of the "
                  "writing over the true continuation's." if judged
                  else "No judge was given, so no `gen_nll`.")  # fmt: skip
    header = ["reveal order", "real words", "distinct words"] + (["word entropy (bits)"] if entropy else [])
    return section(
        f"Scores the blocks `swarm-demo` starts its peers from ([`{r['start_model']}`](../{r['start_model']}), "
        "shipped in the package in bfloat16) as the long run scores its blocks, on the same validation windows, "
        "under each reveal order of the sampler.",
        command("start_model.py", r["settings"].data),
        f"How they were made: {made_how(made)}, on the {made['data']} corpus, started from {made['started_from']}. "
        f"Blocks at steps {plain(r['block_steps'])}: {fixed(f['bits_per_byte'].num('overall'))} bits per byte"
        f"{elbo_beside(f, ' (')}{')' if f.get('elbo_bits_per_byte') is not None else ''}.",
        compressors_line(r),
        peer_needs(r),
        judge_line,
        table(header + (["gen_nll / true"] if judged else []), rows),
        temperature_table(r, "by_temperature"),
        prompt_table(r),
        start_model_samples(r),
    )


def prompt_table(r: Node) -> list[str]:
    """How much the prompt steers the blocks, and the judge where one was given (`prompt_influence`),
    where the run measured it; the command that scored it where it was scored alone, later."""
    p = r.get("prompt_influence")
    if p is None:
        return []
    rows = [prompt_row("blocks", p.get("blocks")), prompt_row("autoregressive (`--judge`)", p.get("autoregressive"))]
    caption = (f"How much the prompt steers (`prompt_influence`): bits per byte of the true continuation after its "
               f"own prompt over the same after another article's, on {plain(p['command']['windows'])} validation "
               "windows; 1.0 for a model that ignores its prompt, lower the more it steers. Each window takes the "
               "prompt of the window half the windows away in the stream (the closest pair "
               f"{p.num('partners_apart_min_units'):,} units apart: another article).")  # fmt: skip
    scored_alone = command("start_model.py", p["command"].data) if p["command"].get("prompt_influence_only") else ""
    return parts(caption, table(["model", "own prompt", "another article's prompt", "prompt_influence"], rows),
                 scored_alone)  # fmt: skip


def prompt_row(name: str, figures: Node | None) -> list[str]:
    """One model's row of `prompt_table`; dashes for one the run did not score (no judge given)."""
    if figures is None:
        return [name, DASH, DASH, f"{DASH} (none given)"]
    return [name] + [fixed(figures.num(k)) for k in ("own_prompt_bits_per_byte", "other_prompt_bits_per_byte",
                                                     "prompt_influence")]  # fmt: skip


def diffusion_likelihood(families: Node, first: Node) -> str:
    """What a diffusion model's bits per byte is in this results file: runs before the exact
    left-to-right figure hold the ELBO for both families."""
    masked = families["masked"]["figures"]["blocks"] if "masked" in families.names() else first
    if masked.get("elbo_bits_per_byte") is None:
        return "a diffusion model's ELBO"
    return "a masked model's exact likelihood of writing left to right, a gaussian one's ELBO"


def elbo_beside(figures: Node, lead: str) -> str:
    """Where a masked model's bits per byte is its exact left-to-right likelihood, `lead` and its ELBO."""
    if figures.get("elbo_bits_per_byte") is None:
        return ""  # the gaussian family, and runs from before the exact figure: bits per byte is the ELBO
    return f"{lead}exact, writing left to right; the ELBO {fixed(figures['elbo_bits_per_byte'].num('overall'))}"


def peer_needs(r: Node) -> str:
    """What a peer of this model needed in the run that trained it (where the results record it)."""
    block, peers = r.get("block"), r["made_by"].get("peers")
    if block is None:
        return ""
    line = (f"One block: {block.num('parameters'):,} parameters, a checkpoint of {size(block.num('checkpoint_bytes'))} "
            f"(float32, as peers save and send it); the shipped start model {size(block.num('shipped_bytes'))} "
            "(bfloat16).")  # fmt: skip
    if peers is not None:
        per_step = peers.num("training_seconds") / r["made_by"].num("steps")
        line += (f" In the run that trained it, {plain(peers['count'])} peers shared this machine's 2 cores: at most "
                 f"{fixed(peers.num('peak_rss_mb'), 0)} MB resident each (its DHT and libp2p daemon included), "
                 f"{fixed(per_step, 2)} s a step.")  # fmt: skip
    return line


def made_how(made: Node) -> str:
    """The run a start model came from: its own words, or swarm-demo's options."""
    if made.get("how") is not None:
        return made["how"]
    return f"`{made['command']} --steps {made['steps']}` with {plain(made['replicas'])} peer(s) per block"


def start_model_samples(r: Node) -> list[str]:
    """Every sample in the figures' reveal order beside the true continuation (older runs: the first
    sample of each order)."""
    written = r["samples"]
    if "true" not in written.data:
        texts = {"prompts": written["prompts"].data}
        texts.update({order: written[order].data for order in r["by_reveal"].names()})
        return samples(Node(texts, r.file), "What they wrote after the first prompt, by reveal order:")
    order = r["settings"]["reveal"]
    rows = [[code(prompt), code(text), code(truth)]
            for prompt, text, truth in zip(written["prompts"].data, written[order].data,
                                           written["true"].data)]  # fmt: skip
    caption = f"What they wrote (`{order}` order) after the opening of validation passages, beside the true text:"
    return [caption, ""] + table(["prompt", "written", "true continuation"], rows)


def reveal_line(r: Node) -> str:
    """The blocks' writing under each reveal order, where the run measured it (before the setting existed,
    every run revealed in random order)."""
    if "blocks_by_reveal" not in r.data:
        return reveal_order(r["settings"])
    rows = r["blocks_by_reveal"]
    orders = "; ".join(f"{order}: `gen_nll` over the true continuation's {times(row.num('gen_nll_over_true'))}, real "
                       f"words {percent(row.num('real_words'))}, distinct words {percent(row.num('distinct_words'))}"
                       for order, row in rows.items())  # fmt: skip
    rescored = " The models were those of the run above, scored again (`--rescore`)." if r.data.get("rescored") else ""
    return f"The blocks' writing by the sampler's reveal order (`--reveal`): {orders}.{rescored}"


SAMPLE_TARGETS = {"distinct_over_true": 0.90, "entropy_over_true": 0.95, "gen_nll_over_true": 1.15}  # issue 44


def temperature_table(r: Node, key: str) -> list[str]:
    """The blocks' writing at each sampler temperature against issue 44's sample targets (distinct
    words and word entropy at least 0.90 and 0.95 of the true text's, the judge's NLL at most 1.15
    of the true continuation's), where the run measured it."""
    if key not in r.data:
        return []
    rows = []
    for temperature, row in r[key].items():
        judged = row.get("gen_nll_over_true") is not None
        met = (row.num("distinct_over_true") >= SAMPLE_TARGETS["distinct_over_true"]
               and row.num("entropy_over_true") >= SAMPLE_TARGETS["entropy_over_true"]
               and judged and row.num("gen_nll_over_true") <= SAMPLE_TARGETS["gen_nll_over_true"])  # fmt: skip
        rows.append([temperature, percent(row.num("real_words")), times(row.num("distinct_over_true")),
                     times(row.num("entropy_over_true")), times(row.num("gen_nll_over_true")) if judged else DASH,
                     yes(met)])  # fmt: skip
    caption = (f"The blocks' writing by the sampler's temperature (`{r['settings']['reveal']}` order), against "
               "the sample targets: distinct words at least 0.90 and word entropy at least 0.95 of the true "
               "text's, the judge's NLL at most 1.15 of the true continuation's:")  # fmt: skip
    header = ["temperature", "real words", "distinct / true", "entropy / true", "gen_nll / true", "all three met"]
    return [caption, ""] + table(header, rows)


def autoregressive_temperature_table(r: Node) -> list[str]:
    """The autoregressive baseline's own writing at each temperature, where the run measured it: the
    same sample figures asked of a model that predicts the text better."""
    if "autoregressive_by_temperature" not in r.data:
        return []
    rows = [[temperature, percent(row.num("real_words")), times(row.num("distinct_over_true")),
             times(row.num("entropy_over_true"))]
            for temperature, row in r["autoregressive_by_temperature"].items()]  # fmt: skip
    caption = ("The autoregressive baseline's own writing at the same temperatures (drawn one unit at a time; no "
               "judge, which would be itself):")
    return [caption, ""] + table(["temperature", "real words", "distinct / true", "entropy / true"], rows)


def reveal_order(settings: Node) -> str:
    if "reveal" not in settings.data:
        return "The masked sampler revealed bytes in random order (the only order when this run was made)."
    return f"The masked sampler's reveal order: `{settings['reveal'].data}`."


def samples(node: Node, caption: str = "What each wrote after the first validation prefix:") -> list[str]:
    """The first sample of each model, beside its prefix and the true continuation."""
    rows = [[name, code(texts[0])] for name, texts in node.items() if len(texts.data)]
    return [caption, ""] + table(["", "text"], rows)
