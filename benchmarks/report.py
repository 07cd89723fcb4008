"""Write benchmarks/README.md from benchmarks/results/**, so that no figure on it is typed by hand.

    python benchmarks/report.py           # rewrite the page (a temp file, then a rename)
    python benchmarks/report.py --check   # exit 1, with one line on stderr, if the page is stale

It runs nothing: it reads the JSON files the benchmarks wrote. Each results folder has one
renderer in RENDERERS; a folder without one, a JSON file no renderer reads, or a key a
renderer needs and does not find is one line on stderr and exit status 1, never a traceback,
because a page written from half a results file would quote figures nobody measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAGE = HERE / "README.md"
NOT_SETTINGS = {"out", "from_json", "model_path", "regions"}  # where files went, not what was measured
DASH = "–"
TITLES = {  # the heading of each results folder's section, in the page's order
    "quality": "Quality", "lr_sweep": "The recipe at equal CPU time", "long_run": "A long run through the swarm", "start_model": "The demo's start model", "serve": "Serving", "sync": "Replica sync", "outer_gap": "The outer mode's loss gap",
    "time_to_loss": "Time to a loss across regions",
    "scale": "Cost as a block grows", "transfer": "Checkpoint transfer", "regions": "Emulated regions",
    "blocks_latency": "Generation latency as B grows", "discovery": "Discovery",
    "chaos": "Chaos", "spot_check_noise": "How many windows a spot check needs", "attacks": "Attacks", "identity_cost": "Identity cost", "health": "Health page",
}  # fmt: skip


class ReportError(Exception):
    """The page cannot be written from the results as they are; the message is the one line for stderr."""


# --- reading results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A dict or list inside one results file: a key it lacks is a ReportError naming the file and the key."""

    data: Any
    file: str
    where: str = ""

    def __getitem__(self, key: str | int) -> Any:
        """The value under key: a Node for a dict or list, the plain value otherwise."""
        try:
            value = self.data[key]
        except (KeyError, IndexError, TypeError):
            raise ReportError(
                f"{self.file}: no key {self.where}{key!s} (rerun the benchmark, or teach report.py)"
            ) from None
        return Node(value, self.file, f"{self.where}{key}.") if isinstance(value, (dict, list)) else value

    def get(self, key: str) -> Any:
        """The value under key, or None where the file does not record it (older runs, optional parts)."""
        return self[key] if isinstance(self.data, dict) and key in self.data else None

    def num(self, key: str | int) -> float | None:
        """A number (None stays None: a figure the run could not measure)."""
        value = self[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            shown = f"a JSON {type(value.data).__name__}" if isinstance(value, Node) else repr(value)[:40]
            raise ReportError(f"{self.file}: {self.where}{key} is {shown}, not a number")
        return value

    def names(self) -> list[str]:
        """The keys of a JSON object (anything else is a ReportError)."""
        if not isinstance(self.data, dict):
            raise ReportError(f"{self.file}: {self.where.rstrip('.') or 'the file'} is not a JSON object")
        return list(self.data)

    def items(self) -> Iterator[tuple[str, Any]]:
        for key in self.names():
            yield key, self[key]

    def __iter__(self) -> Iterator[Any]:
        if not isinstance(self.data, list):
            raise ReportError(f"{self.file}: {self.where.rstrip('.') or 'the file'} is not a JSON list")
        for i in range(len(self.data)):
            yield self[i]


@dataclass
class Folder:
    """One folder under results/: its JSON files (each read is recorded) and its pictures."""

    path: Path
    base: Path  # the page's folder: what its links and error lines are relative to
    read: set[Path] = field(default_factory=set)

    @property
    def rel(self) -> str:
        """The folder as the page links it."""
        return self.path.relative_to(self.base).as_posix()

    def json(self, name: str) -> Node:
        path = self.path / name
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ReportError(f"{self.rel}/{name}: cannot read it as JSON ({error})") from None
        self.read.add(path)
        return Node(data, f"{self.rel}/{name}")

    def subfolders(self) -> list[Folder]:
        """The folders of later runs beside the main one (results/sync/spare/, ...), each its own Folder."""
        return [Folder(p, self.base, self.read) for p in sorted(self.path.iterdir()) if p.is_dir()]

    def unread(self) -> list[Path]:
        return [p for p in sorted(self.path.rglob("*.json")) if p not in self.read]

    def pictures(self) -> str:
        """A line linking every PNG of this folder (not its subfolders')."""
        links = [f"[{p.name}]({self.rel}/{p.name})" for p in sorted(self.path.glob("*.png"))]
        return f"Pictures: {', '.join(links)}." if links else ""


# --- formatting --------------------------------------------------------------------------------------


def fixed(value: float | None, places: int = 3) -> str:
    return DASH if value is None else f"{value:.{places}f}"


def times(value: float | None) -> str:
    """A ratio as the page quotes it: 273x, 29.2x, 1.125x."""
    if value is None:
        return DASH
    return f"{value:.0f}x" if value >= 100 else f"{value:.1f}x" if value >= 10 else f"{value:.3f}x"


def size(value: float | None) -> str:
    """Bytes in B, KB, MB (powers of 1000, as the rates in Mbit/s)."""
    if value is None:
        return DASH
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def percent(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.1f}%"


def yes(value: Any) -> str:
    return DASH if value is None else "yes" if value else "no"


def plain(value: Any) -> str:
    """A setting or a label as it is: lists joined by spaces, text escaped for a table cell."""
    if isinstance(value, Node):
        value = value.data
    if isinstance(value, list):
        return " ".join(plain(v) for v in value)
    if isinstance(value, bool) or value is None:
        return yes(value)
    return str(value).replace("|", "\\|").replace("\n", "⏎")


def code(text: str) -> str:
    """Generated bytes as a code span in a table cell: newlines shown, pipes escaped, backticks fenced."""
    fence = "``" if "`" in text else "`"
    return f"{fence} {plain(text)} {fence}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def flatten(node: Node, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every scalar or list of scalars in node, with dotted names (outer.top_k)."""
    for key, value in node.items():
        if isinstance(value, Node) and isinstance(value.data, dict):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def settings(node: Node | None, skip: set[str] = frozenset(), label: str = "Settings") -> str:
    """The line of settings a run recorded (its options and model), without where its files went."""
    if node is None:
        return ""
    pairs = [f"`{k}` {plain(v)}" for k, v in flatten(node) if k.split(".")[-1] not in NOT_SETTINGS | skip]
    return f"{label}: {', '.join(pairs)}." if pairs else ""


def command(script: str, options: dict[str, Any], root: bool = False) -> str:
    """The command line that produced a results file, from the options it recorded."""
    words = [f"python benchmarks/{script}"]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value not in (False, None):
            words.append(f"{flag} {plain(value)}")
    return f"Command{' (as root)' if root else ''}: `{' '.join(words)}`"


def section(name: str, what: str, *parts: str | list[str]) -> list[str]:
    """A benchmark's part of the page: its heading, what it measures, then its lines and tables."""
    lines = [f"## {TITLES[name]}", "", what, ""]
    for part in parts:
        if isinstance(part, list):
            lines += part
        elif part:
            lines += [part, ""]
    return lines


def targets_table(targets: Node, figure: str = "figure", met: str = "met") -> list[str]:
    """The targets a run checked itself against: the figure and whether it holds (unmeasured ones left out)."""
    rows = []
    for name, target in targets.items():
        if isinstance(target, Node):
            if target[figure] is not None:
                rows.append([plain(name), fixed(target.num(figure)), plain(target.get("target")), yes(target.get(met))])
        elif isinstance(target, bool):
            rows.append([plain(name), DASH, DASH, yes(target)])
        else:  # what the targets were checked at (discovery's "nodes")
            rows.append([plain(name), plain(target), DASH, DASH])
    return table(["target", "figure", "bound", "holds"], rows) if rows else []


# --- one renderer per results folder -----------------------------------------------------------------


def quality(folder: Folder) -> list[str]:
    q = folder.json("quality.json")
    families, ar, params = q["families"], q["autoregressive"], q["parameters"]
    rows = [quality_row(f"{family}: {name}", part["figures"][name], part.get("path_norms"), name)
            for family, part in families.items() for name in ("blocks", "end_to_end")]  # fmt: skip
    rows.append(["autoregressive", fixed(ar["bits_per_byte"].num("overall")), percent(ar.num("real_words")),
                 percent(ar.num("distinct_words")), DASH, DASH, DASH, DASH])  # fmt: skip
    first = families[families.names()[0]]["figures"]["blocks"]
    rows.append(["true continuation", DASH, percent(first.num("true_real_words")),
                 percent(first.num("true_distinct_words")), fixed(first.num("true_nll")), DASH, DASH, DASH])  # fmt: skip
    ratios = [f"{family}: blocks over end-to-end {times(part.num('blocks_over_end_to_end'))}, blocks over "
              f"autoregressive {times(part.num('blocks_over_autoregressive'))}" for family, part in families.items()]  # fmt: skip
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
        "quality",
        "Trains each family's blocks (each as many steps as the end-to-end model) and end-to-end model, and the "
        "autoregressive baseline, on the built-in corpus, each in its own process, and scores them on the same "
        "validation windows: bits per byte (a diffusion model's ELBO, the autoregressive model's teacher-forced "
        "cross-entropy), the share of whole written words that are words of the training text, and in nats per "
        "byte `gen_nll` (the autoregressive judge's NLL of the written bytes), `chain_ce` and `denoise_ce`. The "
        "gaussian chain's path norms are where the chain hands each block its span over where training put "
        "it (1.0 = on the training path). Needs `pip install -e '.[bench]'`.",
        command("quality.py", q["settings"].data),
        settings(q["model"], label="Model"),
        table(header, rows),
        f"Bits per byte: {'; '.join(ratios)}. Default family: `{q['default_family']}`; lowest blocks' bits per "
        f"byte: `{q['best_family_by_blocks_bits_per_byte']}`. {reveal_order(q['settings'])}",
        compressors_line(q),
        costs,
        samples(Node(texts, q.file)),
        folder.pictures(),
    )


def quality_row(label: str, figures: Node, path_norms: Node | None, name: str) -> list[str]:
    norms = DASH if path_norms is None else " ".join(f"{v:.2f}" for v in path_norms[name].data)
    return [label, fixed(figures["bits_per_byte"].num("overall")), percent(figures.get("real_words")),
            percent(figures.get("distinct_words")), fixed(figures.get("gen_nll")), fixed(figures.num("chain_ce")), fixed(figures["denoise_ce"].num("overall")),
            norms]  # fmt: skip


COMPRESSORS = {"gzip": "`gzip -9`", "bzip2": "`bzip2 -9`", "xz": "`xz -9e`",
               "xz_after_train": "`xz -9e` after reading the training text"}  # fmt: skip


def compressors_line(r: Node) -> str:
    """The compressors' bits per byte on the same validation text, where the run computed them."""
    if r.get("compressors") is None:
        return ""
    figures = ", ".join(f"{COMPRESSORS.get(name, name)} {fixed(value)}" for name, value in r["compressors"].items())
    return f"General-purpose compressors on the same validation text, in bits per byte (computed by the run): {figures}."


def lr_sweep(folder: Folder) -> list[str]:
    r = folder.json("lr_sweep.json")
    s = r["settings"]
    rows = [[plain(v["name"]), fixed(v.num("bits_per_byte")), plain(v["steps"]), plain(v.num("lr")),
             plain(v.num("batch_size")), plain(v.num("vocab_size")), yes(v["tie_embeddings"]),
             yes(v["stratified_noise"])] for v in r["variants"]]  # fmt: skip
    return section(
        "lr_sweep",
        "Variants of the recipe side by side at equal CPU time: every block of the built-in model trained alone "
        f"for {plain(s.num('cpu_seconds'))} CPU seconds per variant ({plain(s.num('threads'))} thread, so that "
        "another job on the machine cannot waste a variant's budget), on the peer's schedule sized to the steps "
        "that fit, then the whole model scored on the same validation windows. A variant of `vocab` trains its "
        "own byte-level BPE on the training split first.",
        command("lr_sweep.py", {**s.data, "variants": f"'{s['variants']}'"}),  # one shell word
        table(["variant", "bits per byte", "steps per block", "lr", "batch", "units", "tied", "stratified t"], rows),
        f"Best: `{r['best']}`.",
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
        "long_run",
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
        f"{times(r.num('blocks_over_autoregressive'))} (bits per byte); the blocks' `gen_nll` over the true "
        f"continuation's {times(r.num('gen_nll_over_true'))}.",
        reveal_line(r),
        samples(Node(texts, r.file), "What each wrote after the first prompt:"),
        folder.pictures(),
    )


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
                + ([fixed(f.num("true_word_entropy"), 2)] if entropy else []) + (["1.000x"] if judged else []))  # fmt: skip
    steps = "" if not judged or judge.get("steps") is None else f" of {plain(judge['steps'])} steps"
    judge_line = (f"The judge: an {judge['kind']} model{steps} (`swarm-train --kind autoregressive`), not the long "
                  "run's; `gen_nll` is its NLL of the writing over the true continuation's." if judged
                  else "No judge was given, so no `gen_nll`.")  # fmt: skip
    header = ["reveal order", "real words", "distinct words"] + (["word entropy (bits)"] if entropy else [])
    return section(
        "start_model",
        f"Scores the blocks `swarm-demo` starts its peers from ([`{r['start_model']}`](../{r['start_model']}), "
        "shipped in the package in bfloat16) as the long run scores its blocks, on the same validation windows, "
        "under each reveal order of the sampler.",
        command("start_model.py", r["settings"].data),
        f"How they were made: {made_how(made)}, on the {made['data']} corpus, started from {made['started_from']}. "
        f"Blocks at steps {plain(r['block_steps'])}: {fixed(f['bits_per_byte'].num('overall'))} bits per byte.",
        compressors_line(r),
        peer_needs(r),
        judge_line,
        table(header + (["gen_nll / true"] if judged else []), rows),
        start_model_samples(r),
    )


def peer_needs(r: Node) -> str:
    """What a peer of this model needed in the run that trained it (where the results record it)."""
    block, peers = r.get("block"), r["made_by"].get("peers")
    if block is None:
        return ""
    line = (f"One block: {block.num('parameters'):,} parameters, a checkpoint of {size(block.num('checkpoint_bytes'))} "
            f"(float32, as peers save and send it); the shipped start model {size(block.num('shipped_bytes'))} (bfloat16).")  # fmt: skip
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
            for prompt, text, truth in zip(written["prompts"].data, written[order].data, written["true"].data)]  # fmt: skip
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


def reveal_order(settings: Node) -> str:
    if "reveal" not in settings.data:
        return "The masked sampler revealed bytes in random order (the only order when this run was made)."
    return f"The masked sampler's reveal order: `{settings['reveal'].data}`."


SWARM_FACTS = ("peers", "sync")  # what the swarm was, not options (older files kept them among the settings)


def peers_line(r: Node) -> str:
    """How many peers the run started and how they synced, wherever the results file keeps it."""
    facts = r["swarm"].data if "swarm" in r.data else r["settings"].data
    return f"The swarm: {plain(facts['peers'])} peers, one per block, each `--sync {facts['sync']}`."


def samples(node: Node, caption: str = "What each wrote after the first validation prefix:") -> list[str]:
    """The first sample of each model, beside its prefix and the true continuation."""
    rows = [[name, code(texts[0])] for name, texts in node.items() if len(texts.data)]
    return [caption, ""] + table(["", "text"], rows)


def serve(folder: Folder) -> list[str]:
    s = folder.json("serve.json")
    rows = []
    for length, run in s["lengths"].items():
        single, ar = run["single_pass"], run["autoregressive"]
        rows.append([length, fixed(single.num("median_seconds")), plain(single["hops"]), fixed(ar.num("median_seconds")),
                     plain(ar["hops"]), times(run.num("latency_ratio_autoregressive_over_single_pass"))])  # fmt: skip
    defences = s["defences"]
    checked = (f"Cross-checking replicas cost {fixed(defences.num('extra_requests_per_request'))} extra requests per "
               f"request and {percent(defences.num('cross_check_seconds_over_request_seconds'))} of the request time, "
               f"with {plain(defences['cross_check']['disagreements'])} disagreements.")  # fmt: skip
    options = {"lengths": s["lengths"].names(), "steps_per_block": s["steps_per_block"]}
    header = ["bytes", "single-pass s", "hops", "autoregressive s", "hops", "autoregressive / single-pass"]
    return section(
        "serve",
        "Starts a bootstrap node and peers for every block (separate processes on 127.0.0.1) and times "
        "generating each length single-pass (one trip through the blocks per span) against an autoregressive "
        "pipeline over the same peers (one trip through every stage per byte); every block has two replicas "
        "of one checkpoint, so the client cross-checks them.",
        command("serve.py", options),
        f"Settings: `n_blocks` {s['n_blocks']}, `gen_len` {s['gen_len']}.",
        table(header, rows),
        checked,
        folder.pictures(),
    )


def later_runs(folder: Folder, run: Callable[[Folder, str], list[str]]) -> list[str]:
    """The runs kept in a folder's subfolders beside its main one, each under a heading of its own."""
    return [line for sub in folder.subfolders() for line in run(sub, f"Later run, `{sub.rel}/`")]


def sync(folder: Folder) -> list[str]:
    later = later_runs(folder, lambda sub, title: sync_run(sub, "sync.json", title))
    parts = sync_run(folder, "sync.json", "") + os_check(folder) + later
    return section(
        "sync",
        "Runs replicas of one block of a small model in separate processes and syncs them in each mode: dense "
        "fp32 gradients (the baseline), DeMo in lockstep or overlapped, outer steps on a compressed "
        "pseudo-gradient; on 127.0.0.1, then (as root) in emulated regions. Bytes are per replica per step, "
        "losses are validation losses at equal steps, utilisation is compute time over wall time (lowest and mean "
        "replica), drift is the largest difference between the replicas' final checkpoints. Needs "
        "`pip install -e '.[bench]'`.",
        parts,
    )


SYNC_OPTIONS = ("replicas", "steps", "modes", "region_replicas", "region_steps", "region_modes")
WAIT_COLUMNS = {"network_wait_fraction_max": "network wait", "slower_replica_wait_fraction_max": "slower-replica wait",
                "spare_batch_fraction_max": "spare batches"}  # fmt: skip


def sync_run(folder: Folder, name: str, title: str) -> list[str]:
    """One sync.py results file: its command, settings, one table per placement, its targets."""
    s = folder.json(name)
    config = s["config"]
    lines = [f"### {title}", ""] if title else []
    lines += [command("sync.py", {k: config[k] for k in SYNC_OPTIONS}, root=True), "",
              settings(config, set(SYNC_OPTIONS)), ""]  # fmt: skip
    for group, modes in s["summary"]["side_by_side"].items():
        waits = [c for c in WAIT_COLUMNS if any(c in row.names() for _, row in modes.items())]
        header = ["mode", "steps", "bytes", "dense / mode", "loss", "loss / dense", "util. min", "util. mean", "step s"]
        header += [WAIT_COLUMNS[c] for c in waits] + ["drift"]
        rows = [sync_row(mode, row, waits, drift(s["runs"], group, mode, row)) for mode, row in modes.items()]
        lines += [f"{plain(group)}:", ""] + table(header, rows)
    return lines + targets_table(s["summary"]["targets"]) + [folder.pictures(), ""]


def sync_row(mode: str, row: Node, waits: list[str], drift_value: float | None) -> list[str]:
    return [mode, plain(row["steps"]), size(row.num("bytes_sent_per_replica_per_step")),
            times(row.get("bytes_dense_over_mode")), fixed(row.num("validation_loss")),
            times(row.get("validation_loss_mode_over_dense")), fixed(row.num("compute_utilisation_min")),
            fixed(row.num("compute_utilisation_mean")), fixed(row.num("step_seconds"))] + \
        [percent(row.get(c)) for c in waits] + [fixed(drift_value, 4)]  # fmt: skip


def drift(runs: Node, group: str, mode: str, row: Node) -> float | None:
    """The drift between final checkpoints of the run a summary row comes from ("regions, 4 replicas")."""
    placement = group.split(",")[0]
    for run in runs:
        if (run["mode"], run["steps"], run["placement"]) == (mode, row["steps"], placement):
            return run.num("drift_between_final_checkpoints")
    return None


def os_check(folder: Folder) -> list[str]:
    """sync_os_check.json: the bytes the peers counted beside what the kernel sent."""
    if not (folder.path / "sync_os_check.json").exists():
        return []
    check = folder.json("sync_os_check.json")
    rows = []
    for mode, run in check.items():
        if isinstance(run, Node):
            counted = [run["counted_bytes_sent"].num(r) for r in run["counted_bytes_sent"].names()]
            kernel = [run["kernel_tx_bytes"].num(r) for r in run["kernel_tx_bytes"].names()]
            rows.append([mode, plain(run["steps"]), size(sum(counted) / len(counted)), size(sum(kernel) / len(kernel))])
    return [
        "### The kernel's count", "", command("sync.py", {"os_check_only": True}, root=True), "",
        ("Bytes each replica counted as sent for sync beside what the kernel sent from its namespace (mean "
         f"replica; the kernel's count includes DHT traffic and headers). Dense over DeMo by the kernel's count: "
         f"{times(check.num('kernel_ratio_dense_over_demo16'))}."), "",
    ] + table(["mode", "steps", "counted", "kernel"], rows)  # fmt: skip


def outer_gap(folder: Folder) -> list[str]:
    parts = outer_gap_run(folder, "") + later_runs(folder, outer_gap_run)
    return section(
        "outer_gap",
        "Runs the outer mode's replicas and the dense baseline (gradients averaged every step) in one process, "
        "with no network, for longer than peers could run here, to see whether the outer mode's loss gap closes "
        "as the run grows longer.",
        parts,
    )


def outer_gap_run(folder: Folder, title: str) -> list[str]:
    g = folder.json("outer_gap.json")
    config = g["config"]
    rows = [[plain(r["steps"]), fixed(r.num("dense_loss")), fixed(r.num("outer_loss")), times(r.num("outer_over_dense")),
             size(r.num("outer_payload_bytes_per_step"))] for r in g["runs"]]  # fmt: skip
    options = {k: config[k] for k in ("steps", "replicas", "batch_size", "block", "outer_lr")}
    lines = [f"### {title}", ""] if title else []
    return (
        lines
        + [command("outer_gap.py", options), "", settings(config, set(options)), ""]
        + table(["steps", "dense loss", "outer loss", "outer / dense", "payload per replica per step"], rows)
        + [folder.pictures(), ""]
    )


TIME_TO_LOSS_OPTIONS = ("modes", "replicas", "steps", "save_every")


def time_to_loss(folder: Folder) -> list[str]:
    """time_to_loss.json: each mode's efficiency (no-delay seconds to its final loss / regions seconds to it)."""
    r = folder.json("time_to_loss.json")
    config, s = r["config"], r["summary"]
    rows = []
    for mode, m in r["modes"].items():
        if m.get("error") is not None:
            rows.append([mode, *[DASH] * 7, f"failed: {plain(m['error'])}"])
            continue
        runs = m["runs"]
        took = fixed(m.num("regions_seconds"), 1) if m["reached"] else "not reached"
        first = " / ".join(fixed(runs[p]["curve"][1].num("seconds"), 1) for p in ("no-delay", "regions"))
        rows.append([mode, fixed(m.num("target_loss")), fixed(m.num("no_delay_seconds"), 1), took,
                     fixed(m.num("efficiency")), times(m.num("final_loss_over_target")), first,
                     fixed(runs["regions"]["run"].num("compute_utilisation_min")),
                     fixed(runs["regions"]["run"].num("step_seconds"))])  # fmt: skip
    best = s["best_mode"]
    headline = (f"Best mode: `{best}`, efficiency {fixed(s.num('best_efficiency'))}; at least {s.num('target')}: "
                f"{yes(s['met'])}." if best else "No mode's regions run reached its no-delay run's final loss.")  # fmt: skip
    header = ["mode", "target loss", "no-delay s", "regions s", "efficiency", "regions final / target",
              "first save s (no-delay / regions)", "regions util. min", "regions step s"]  # fmt: skip
    return section(
        "time_to_loss",
        "For each sync mode, the same replicas of one block run twice from the same start weights with the same batches "
        "(each replica keeps one peer id): in the emulated regions, and in the same lab with no delay and no cap. "
        "The target is the no-delay run's final validation loss (mean replica; the same validation windows for "
        "every checkpoint); efficiency is the no-delay run's wall seconds to it over the regions run's, each "
        "from the run's first step to the first time its curve reaches the target, linear between saves (1.0: "
        "the internet cost nothing). This is the headline sync figure; utilisation (lowest replica) and step "
        "time of the regions run are diagnostics, and so is each run's time to its first save. As root.",
        command("time_to_loss.py", {k: config[k] for k in TIME_TO_LOSS_OPTIONS}, root=True),
        settings(config, set(TIME_TO_LOSS_OPTIONS)),
        headline,
        table(header, rows),
        folder.pictures(),
    )


TRANSFER_COLUMNS = ["case", "MB", "hosts", "seconds", "Mbit/s", "over cap", "cpu_steal"]


def scale(folder: Folder) -> list[str]:
    parts = scale_run(folder, "") + later_runs(folder, scale_run)
    return section(
        "scale",
        "One block at several sizes through the library's own code: the trainer's forward and backward, each sync "
        "mode's compress, encode, decode and apply with 4 replicas' payloads gathered (outer: a round spread over "
        "its H steps), bytes per replica per step against dense fp32 all-reduce, the peak RSS of a fresh process "
        "training the block beside its weights, gradients and AdamW state (and its RSS before the block: the fixed "
        "overhead; on a GPU, its peak allocation there and what was allocated before the block), the checkpoint's "
        "bytes, save and load, its download at 20 and 100 Mbit/s (bytes over the link plus the receiver's measured "
        "work), the spot check and one denoise request (4 steps, one prompt).",
        parts,
    )


def scale_run(folder: Folder, title: str) -> list[str]:
    """One scale.py results file: its command, two tables, its slopes and targets."""
    r = folder.json("scale.json")
    steps, costs = [], []
    on_gpu = r["sizes"][0]["memory"].get("peak_gpu_bytes") is not None
    for s in r["sizes"]:
        sync, memory, checkpoint = s["sync"], s["memory"], s["checkpoint"]
        name = f"{plain(s['size'])} ({s.num('parameters') / 1e6:.2f} M)"
        steps.append([name, fixed(s.num("forward_backward_s")), fixed(s.num("adamw_step_s")),
                      percent(sync["demo"].num("over_forward_backward")), percent(sync["outer"].num("over_forward_backward")),
                      size(sync["dense"].num("bytes_per_replica_per_step")), times(sync["demo"].num("dense_over_mode")),
                      times(sync["outer"].num("dense_over_mode"))])  # fmt: skip
        peak = [size(memory.num("peak_gpu_bytes")), size(memory.num("gpu_overhead_bytes"))] if on_gpu else []
        costs.append([name, size(memory.num("peak_rss_bytes")), size(memory.num("overhead_bytes")), *peak,
                      size(memory.num("state_bytes")), fixed(memory.num("peak_above_overhead_over_state"), 2),
                      size(checkpoint.num("bytes")), fixed(checkpoint.num("save_s")), fixed(checkpoint.num("load_s")),
                      fixed(checkpoint["download_s"].num("20"), 2), fixed(checkpoint["download_s"].num("100"), 2),
                      fixed(s.num("spot_check_s")), fixed(s.num("denoise_s"))])  # fmt: skip
    fitted = r["slopes"]
    slopes = ", ".join(f"`{name}` {fixed(fitted.num(name), 2)}" for name in fitted.names() if fitted[name] is not None)
    smoke = "" if r["complete"] else ("Not every default size was measured: the slopes come from these sizes alone.")
    step_header = ["size (parameters)", "forward+backward s", "AdamW s", "DeMo sync / f+b", "outer sync / f+b",
                   "dense bytes / step", "dense / DeMo", "dense / outer"]  # fmt: skip
    gpu_header = ["peak GPU", "GPU before block"] if on_gpu else []
    cost_header = ["size", "peak RSS", "overhead", *gpu_header, "weights+grads+AdamW", "(peak - overhead) / that",
                   "checkpoint", "save s", "load s", "download 20 Mbit/s s", "100 Mbit/s s", "spot check s",
                   "denoise s"]  # fmt: skip
    lines = [f"### {title}", ""] if title else []
    for part in (smoke, plain(r.get("note") or ""), command("scale.py", r["settings"].data)):
        lines += [part, ""] if part else []
    return (
        lines
        + table(step_header, steps)
        + table(cost_header, costs)
        + scale_memory_modes(r["sizes"])
        + [f"Slopes against the parameter count (least squares on log-log; 1 is linear): {slopes}.", ""]
        + targets_table(r["targets"])
        + [folder.pictures(), ""]
    )


MEMORY_LABELS = {"memory": "plain", "memory_checkpointed": "activations checkpointed", "memory_low": "--low-memory"}


def scale_memory_modes(sizes: Node) -> list[str]:
    """Each size trained plainly, with activation checkpointing and as `swarm-peer --low-memory`
    does (each in a fresh process): memory above the overhead and the median step time; nothing
    for a run from before scale.py measured them."""
    if sizes[0].get("memory_low") is None:
        return []
    rows = []
    for s in sizes:
        plain_s = s["memory"].num("step_s")
        for key, label in MEMORY_LABELS.items():
            memory = s[key]
            rows.append([plain(s["size"]), label, size(memory.num("peak_above_overhead_bytes")),
                         fixed(memory.num("peak_above_overhead_over_state"), 2), fixed(memory.num("step_s")),
                         times(memory.num("step_s") / plain_s)])  # fmt: skip
    header = ["size", "training", "peak - overhead", "(peak - overhead) / state", "step s", "step / plain"]
    return ["Memory by how the block trains (a fresh process each; step: forward, backward and AdamW):", ""] + table(
        header, rows
    )


def transfer(folder: Folder) -> list[str]:
    t = folder.json("transfer.json")
    config = t["config"]
    rows, ratios = [], []
    for scenario in config["scenarios"]:
        for case, run in t[scenario].items():
            if isinstance(run, Node) and "mbit_per_s" in run.names():
                rows.append(transfer_row(f"{scenario}: {case}", run))
            elif case.endswith(("_over_plain_tcp", "_over_clean")):
                ratios.append(f"`{case}` {times(run)}")
    corrupt = t.get("corrupt")
    verdict = (f" A corrupting host was dropped in every run: {yes(corrupt['corrupt_host_dropped_every_run'])}; "
               f"liars served nothing: {yes(corrupt['liars_served_nothing'])}.") if corrupt else ""  # fmt: skip
    return section(
        "transfer",
        "Downloads a checkpoint through emulated links (network namespaces, `tc` caps and delays) from several "
        "hosts at once, from one host over a long fat link beside one plain TCP connection on the same link, and "
        "from hosts of which one corrupts or forges chunks. `over cap` is the rate over the link's cap; "
        "`cpu_steal` is the share of CPU the hypervisor gave other guests meanwhile.",
        command("transfer.py", {"scenarios": config["scenarios"]}, root=True),
        settings(config, {"scenarios"}),
        table(TRANSFER_COLUMNS, rows),
        f"Ratios: {', '.join(ratios)}.{verdict}" if ratios else verdict,
        targets_table(t["targets"], "value", "holds"),
        folder.pictures(),
    )


def transfer_row(case: str, run: Node) -> list[str]:
    return [case, fixed(run.num("bytes") / 1e6, 1), plain(run["hosts"]), fixed(run.num("seconds"), 2),
            fixed(run.num("mbit_per_s"), 1), fixed(run.num("over_cap")), fixed(run.get("cpu_steal"), 2)]  # fmt: skip


def regions(folder: Folder) -> list[str]:
    r = folder.json("regions.json")
    summary = r["summary"]
    rows = [[region, fixed(c.num("single_pass_seconds"), 2), plain(c["single_pass_bytes"]),
             fixed(c.num("slowest_download_over_cap")), times(c.num("latency_ratio_autoregressive_over_single_pass"))]
            for region, c in summary["per_client_region"].items()]  # fmt: skip
    return section(
        "regions",
        "Builds regions from `benchmarks/regions.yaml` (a network namespace per process, a router that delays "
        "each packet by its regions' one-way delay, link caps), starts a swarm there and runs `swarm-bench "
        "latency` from a client in every region; a host of block 0 then joins behind a home router (NAT) beside "
        "its twin without NAT, and the client compares them with every other host of block 0 stopped.",
        command("regions.py", {}, root=True), settings(r["config"]),
        f"Round trips between regions within 10% of the configured ones: {plain(summary['inter_region_rtts_within_10_percent'])}.",
        table(["client region", "single-pass s", "bytes", "slowest download / cap", "autoregressive / single-pass"], rows),
        nat(summary["nat"]), folder.pictures(),
    )  # fmt: skip


def nat(n: Node) -> list[str]:
    """Relayed (the host behind NAT) against direct (its twin), for block 0 from the same client."""
    announced = n["announced"]  # twin -> "direct" or "relayed"
    by_twin = {
        "seconds until reachable": n["seconds_until_reachable"],
        "first contact ms": n["rtt_ms"]["first_contact"],
    }
    by_kind = {
        "round trip ms": n["rtt_ms"],
        "download Mbit/s": n["download_mbit_per_s"],
        "single pass s": n["single_pass_seconds"],
        "block 0 request s": n["block_0_request_seconds"],
    }
    rows = [
        [label, *(fixed(node.num(twin), 2) for twin in sorted(announced.names(), key=announced.__getitem__))]
        for label, node in by_twin.items()
    ]  # direct sorts before relayed
    rows += [[label, fixed(node.num("direct"), 2), fixed(node.num("relayed"), 2)] for label, node in by_kind.items()]
    ratios = ", ".join(f"{k.replace('_', ' ')} {times(v)}" for k, v in n["ratios_relayed_over_direct"].items())
    bootstrap, between = n["bootstrap_bytes"], n["between_peers_behind_nat"]
    return [f"Behind NAT, from {plain(n['from'])}:", ""] + table(["", "direct", "relayed"], rows) + [
        (f"Relayed over direct: {ratios}. The bootstrap (the only relay) moved "
         f"{size(bootstrap.num('while_block_0_was_behind_nat'))} while block 0 was behind NAT and "
         f"{size(bootstrap.num('while_block_0_was_direct'))} while it was direct. Between two hosts behind the same "
         f"router the direct route is `{plain(between['route'])}`: {fixed(between.num('rtt_ms'), 0)} ms round trip "
         "through the relay."), ""]  # fmt: skip


def blocks_latency(folder: Folder) -> list[str]:
    r = folder.json("blocks_latency.json")
    summary, config = r["summary"], r["config"]
    rows = [[plain(place), plain(b), fixed(row.num("rtt_ms_median"), 1), fixed(row.num("single_pass_seconds"), 2),
             plain(row["single_pass_hops"]), fixed(row.num("autoregressive_seconds"), 1), plain(row["autoregressive_hops"]),
             times(row.num("ratio_autoregressive_over_single_pass")), fixed(row.num("fetch_seconds"), 1),
             size(row.num("model_bytes"))]
            for place, per_b in summary["places"].items() for b, row in per_b.items()]  # fmt: skip
    header = ["place", "B", "round trip ms", "single-pass s", "hops", "autoregressive s", "hops",
              "autoregressive / single-pass", "swarm-fetch s", "model"]  # fmt: skip
    return section(
        "blocks_latency",
        "The default model's layers split into B blocks, each B its own swarm: the bootstrap and one peer per block in "
        f"{plain(config['peer_region'])}, a client in {plain(config['client_region'])} (emulated regions as above), and "
        "again on 127.0.0.1 where `loopback` rows are shown. From the client: `swarm-bench latency --autoregressive` "
        "(single-pass generation at the steps per block given, B requests a span, against the autoregressive pipeline "
        "with B stages, B requests a byte) and the wall time of `swarm-fetch` assembling the model (its start, "
        "downloads and spot checks included).",
        command("blocks_latency.py", {}, root=True),
        settings(config),
        settings(r["models"][r["models"].names()[0]], {"n_blocks"}, label="Model, each B alike but for `n_blocks`"),
        table(header, rows),
        targets_table(summary["targets"]),
        f"The whole run took {fixed(r.num('seconds') / 60, 1)} minutes.",
        folder.pictures(),
    )


def discovery(folder: Folder) -> list[str]:
    d = folder.json("discovery.json")
    rows = [[plain(s["nodes"]), fixed(s["lookup_rpcs"].num("median"), 0), fixed(s["lookup_rpcs"].num("p95"), 0),
             fixed(s["lookup_round_trips"].num("median"), 0), fixed(s["lookup_round_trips"].num("p95"), 0),
             fixed(s["lookup_round_trips"].num("max"), 0), fixed(s["lookup_seconds"].num("median"), 2),
             fixed(s["every_block_seconds"].num("median"), 2), fixed(s["visibility_periods"].num("median"), 2),
             fixed(s["visibility_periods"].num("max"), 2), fixed(s.num("hosts_found_min"), 2)] for s in d["sizes"]]  # fmt: skip
    header = ["nodes", "find RPCs median", "p95", "round trips median", "p95", "max", "one block s", "every block s",
              "seen after (periods) median", "max", "share of hosts found (min)"]  # fmt: skip
    network = d["network"]
    placed = f"Placement: {plain(network['placement'])}" + (
        f" ({plain(network['regions'])})." if network.get("regions") else "."
    )
    return section(
        "discovery",
        "Grows a swarm of real hivemind DHT nodes, each announcing a block as peers do (a signed entry every "
        "announce period), and measures fresh clients' lookups of every block (find RPCs and round trips traced "
        "inside the client's DHT process) and how many announce periods pass before a new announcement is seen "
        "from another region.",
        command("discovery.py", {"sizes": d["config"]["sizes"]}, root=True), settings(d["config"], {"sizes"}),
        placed, table(header, rows), targets_table(d["targets"]), folder.pictures(),
    )  # fmt: skip


CHAOS_COUNTS = ("killed_sigkill", "killed_sigterm", "restarted_in_place", "started_fresh", "hangs", "steps_lost",
                "fetches_tried", "fetches_succeeded", "torn_checkpoints", "checkpoints_checked",
                "samples_with_a_block_down")  # fmt: skip


def chaos(folder: Folder) -> list[str]:
    c = folder.json("chaos.json")
    calm, storm = c["calm"], c["chaos"]
    rows = [["calm", fixed(calm.num("seconds_to_finish"), 0), fixed(calm.num("denoise_ce"))],
            ["chaos", fixed(storm.num("seconds_to_finish"), 0), fixed(storm.num("denoise_ce"))]]  # fmt: skip
    counts = [[k.replace("_", " "), plain(storm[k])] for k in CHAOS_COUNTS] + [
        ["blocks lost", str(len(storm["blocks_lost"].data))]
    ]
    config = c["config"]
    return section(
        "chaos",
        "Runs a small swarm calm, then again while a random peer is killed (SIGKILL or SIGTERM) and replaced every "
        "few seconds, fetching the model meanwhile, and compares the two.",
        command("chaos.py", {"duration": config["duration"]}), settings(config, {"duration"}),
        table(["run", "seconds to finish", "denoise_ce"], rows),
        f"Denoising CE, chaos over calm: {times(c.num('denoise_ce_chaos_over_calm'))}.",
        table(["during the chaos", "count"], counts), folder.pictures(),
    )  # fmt: skip


def attacks(folder: Folder) -> list[str]:
    a = folder.json("attacks.json")
    config, model, options = a["config"], a["model"], a.get("peer_options")
    met = a.get("met")
    return section(
        "attacks",
        "Runs each attack beside a clean run on a small model in separate processes on 127.0.0.1 (the attacks and "
        "their bounds: `benchmarks/attacks.py`). Part 1: a trained swarm of two blocks and one liar at a time, then a "
        "fetch, a joiner and generation through the swarm. Part 2: one block, one hostile replica beside three honest "
        "ones, then beside two; the honest replicas' loss over a clean run of the same honest replicas. Part 3, "
        "where run: one honest replica beside a stranger, over the same replica alone.",
        command("attacks.py", {"parts": config["parts"]}),
        settings(config, {"parts"}),
        settings(model, label="Model"),
        f"Honest peers' options beyond their defaults: `{plain(options)}`." if options is not None else "",
        attack_fetches(a["fetch_and_serve"]) if a.get("fetch_and_serve") is not None else [],
        f"Loss: {plain(a['loss'])}." if a.get("loss") is not None else "",
        attack_training(a["training"]) if a.get("training") is not None else [],
        attack_two_replicas(a["two_replicas"]) if a.get("two_replicas") is not None else [],
        f"Every row within its bounds, every honest peer up: {yes(met)}." if met is not None else "",
        folder.pictures(),
    )


def honest_peers(row: Node) -> tuple[str, str]:
    """The honest peers' peak RSS over the clean run's, and whether every one was up and announcing."""
    peers = row.get("honest_peers")
    return (times(peers.get("peak_rss_over_clean")), yes(peers["ok"])) if peers is not None else (DASH, DASH)


def attack_fetches(part: Node) -> list[str]:
    rows = [(name, row) for name, row in part.items() if isinstance(row, Node)]
    bits = any(row.get("bits_per_byte_over_clean") is not None for _, row in rows)  # runs before issue 26: denoise_ce
    figure, key = ("bits per byte", "bits_per_byte_over_clean") if bits else ("denoise_ce", "denoise_ce_over_clean")
    lines = []
    for name, attack in rows:
        fetch, joiner, generation = attack.get("fetch"), attack.get("joiner"), attack.get("generation")
        lines.append([name, times(attack.get(key)), plain(fetch.get("steps")) if fetch else DASH,
                      plain(joiner["step"]) if joiner else DASH,
                      yes(generation.get("used_only_clean_checkpoints")) if generation else DASH,
                      yes(generation["equals_clean_local_generation"]) if generation else DASH,
                      plain(generation["cross_check"]["banned"]) if generation else DASH,
                      *honest_peers(attack), yes(attack.get("met"))])  # fmt: skip
    crashed = f"Honest peers crashed: {plain(part['honest_peers_crashed'])}."
    header = ["part 1", f"fetched {figure} / clean", "fetched steps", "joiner's step", "generation used clean checkpoints",
              "generation = local", "banned", "honest peak RSS / clean", "honest peers up", "met"]  # fmt: skip
    return table(header, lines) + [crashed, ""]


def attack_training(part: Node) -> list[str]:
    rows = [[plain(run["attack"]), plain(run["value_bits"]), plain(run["honest_replicas"]), fixed(run.num("validation_loss")),
             times(run.get("honest_loss_over_clean")), plain(run.get("final_steps")), plain(run.get("merged")),
             honest_peers(run)[0], plain(run["honest_crashed"]), yes(run["hung"]), yes(run.get("met"))]
            for _, run in part.items() if isinstance(run, Node)]  # fmt: skip
    header = ["part 2: attack", "value bits", "honest replicas", "loss", "honest loss / clean", "final steps", "merges",
              "peak RSS / clean", "crashed", "hung", "met"]  # fmt: skip
    return table(header, rows)


def attack_two_replicas(part: Node) -> list[str]:
    rows = [[plain(run["attack"]), fixed(run.num("validation_loss")), times(run.get("loss_over_lone")),
             fixed(run.get("weight_distance_over_travel")), plain(run["final_steps"]), honest_peers(run)[0],
             yes(run["hung"]), yes(run["met"])] for _, run in part.items() if isinstance(run, Node)]  # fmt: skip
    header = ["part 3: beside the replica", "loss", "loss / alone", "weight distance / travel", "final step",
              "peak RSS / alone", "hung", "met"]  # fmt: skip
    start = f"The start weights' loss: {fixed(part.num('start_loss'))}."
    return table(header, rows) + [start, ""]


def identity_cost(folder: Folder) -> list[str]:
    c = folder.json("identity_cost.json")
    config, reader, at = c["config"], c["reader"], c["at_recommended"]
    rows = [[plain(e["bits"]), plain(e["expected_tries"]), fixed(e.num("core_seconds"), 0),
             fixed(e.num("core_seconds") / 3600, 2)] for e in c["expected"]]  # fmt: skip
    solved = ", ".join(plain(s["tries"]) for s in c["small_solves"])
    return section(
        "identity_cost",
        "Costs the scrypt work an open swarm's creator can ask of every identity (`--identity-work`), on one core: "
        "one try, the expected cost of a solve at several prices, actual solves at a small price, what a reader "
        "spends checking records, and what an attacker's Sybil identities cost beside an honest joiner's one.",
        command("identity_cost.py", {}), settings(config, {"bits"}),
        f"One scrypt try (n = 2^{plain(config['log2_n'])}, r = {plain(config['r'])}, "
        f"{size(c.num('memory_per_try_bytes'))} of memory): {fixed(c.num('seconds_per_try'), 4)} s of one core, "
        f"{fixed(c.num('tries_per_second'), 1)} tries a second.",
        table(["bits", "expected tries", "core seconds", "core hours"], rows),
        f"Actual solves at {plain(config['small_bits'])} bits took {solved} tries (mean "
        f"{fixed(c.num('small_solve_mean_tries'), 1)}, expected {plain(c['small_solve_expected_tries'])}).",
        f"A reader spends {fixed(reader.num('new_record_seconds'), 4)} s on a record it has not judged (one try) and "
        f"{fixed(reader.num('judged_record_seconds'), 6)} s on one it has; one read amid "
        f"{plain(reader['flood_records'])} new records with bad nonces checked {plain(reader['flood_records_checked'])} "
        f"of them, in {fixed(reader.num('flood_read_seconds'), 3)} s.",
        f"At the recommended price, {plain(at['bits'])} bits: an honest joiner pays "
        f"{fixed(at.num('honest_joiner_core_seconds'), 0)} s of one core, once per key and peer id; "
        f"{plain(at['sybils'])} Sybil identities cost an attacker {fixed(at.num('attacker_core_seconds'), 0)} s "
        f"({fixed(at.num('attacker_core_hours'), 2)} core hours).",
    )  # fmt: skip


def health(folder: Folder) -> list[str]:
    state = folder.json("state.json")
    blocks = list(state["blocks"])
    verified = sum(b["verified"] for b in blocks)
    shown = (f"The page showed the swarm `{plain(state['status'])}`: {sum(b['healthy'] for b in blocks)} of "
             f"{plain(state['n_blocks'])} blocks healthy, {verified} verified hosts, "
             f"{len(state['pings'].data)} round trips between peers (`state.json` holds what it showed).")  # fmt: skip
    pictures = [f"![the health page]({folder.rel}/{p.name})" for p in sorted(folder.path.glob("*.png"))]
    return section(
        "health",
        "Runs `swarm-demo`, waits until its health page shows every block healthy with a few loss points, and "
        "takes a screenshot in headless Chromium.",
        command("health_page.py", {}) + " (its settings are not recorded in the results)",
        shown,
        *pictures,
    )


Renderer = Callable[[Folder], list[str]]
def spot_check_noise(folder: Folder) -> list[str]:
    r = folder.json("spot_check_noise.json")
    rows = [[plain(count), fixed(row.num("mean_difference")), fixed(row.num("se_difference")),
             fixed(row["se_difference_by_source"].num("train")), fixed(row["se_difference_by_source"].num("validation")),
             fixed(row.num("se_score")), fixed(row.num("seconds_per_measure"), 2)]
            for count, row in r["windows_per_source"].items()]  # fmt: skip
    return section(
        "spot_check_noise",
        f"One block ({plain(r['block'])}) of the {r['config']} config trained {plain(r['steps'])} steps, kept at "
        f"{plain(r.num('steps') - r.num('apart'))} and at {plain(r['steps'])}; for each count of windows per source "
        f"(train and validation), {plain(r['repeats'])} spot checks with their own private seeds measure both. The "
        "standard deviation of their score differences is the standard error of one check's comparison "
        "(nats per unit), against the spot check's tolerance.",
        f"Command: `python benchmarks/spot_check_noise.py --steps {r['steps']} --apart {r['apart']} "
        f"--repeats {r['repeats']} --threads {r['threads']}`",
        table(["windows per source", "mean difference", "its standard error", "train only", "validation only",
               "one score's standard error", "seconds a measure"], rows),  # fmt: skip
    )


RENDERERS: dict[str, Renderer] = {
    "quality": quality, "lr_sweep": lr_sweep, "long_run": long_run, "start_model": start_model, "serve": serve, "sync": sync, "outer_gap": outer_gap, "scale": scale,
    "time_to_loss": time_to_loss,
    "transfer": transfer,
    "regions": regions, "blocks_latency": blocks_latency, "discovery": discovery, "chaos": chaos, "spot_check_noise": spot_check_noise, "attacks": attacks, "identity_cost": identity_cost,
    "health": health,
}  # fmt: skip


# --- the page ----------------------------------------------------------------------------------------

INTRO = """# Benchmarks

<!-- generated by benchmarks/report.py from benchmarks/results/: do not edit; run `python benchmarks/report.py` -->

Every figure on this page is read from a results file under [`results/`](results/) by
[`report.py`](report.py); none is typed by hand. Each benchmark prints JSON, writes its results
folder and draws its pictures; the commands run from the repository root, and most need
`pip install -e '.[bench]'`. Those marked "as root" build network namespaces (see
`.ci/regions-setup`). The settings are the ones each results file records.
"""


def render(results: Path) -> str:
    """The whole page, from every results folder; a ReportError where one cannot be rendered."""
    if not results.is_dir():
        raise ReportError(f"{results} is not a folder of results")
    folders = sorted(p for p in results.iterdir() if p.is_dir())
    unknown = [p.name for p in folders if p.name not in RENDERERS]
    if unknown:
        raise ReportError(f"results/{unknown[0]}/ has no renderer: add one to RENDERERS in benchmarks/report.py")
    present = [name for name in RENDERERS if (results / name).is_dir()]
    contents = [f"- [{TITLES[name]}](#{anchor(TITLES[name])})" for name in present]
    lines = [INTRO, *contents, ""]
    for name in present:
        folder = Folder(results / name, results.parent)
        lines += render_folder(name, folder)
        if unread := folder.unread():
            raise ReportError(f"{unread[0].relative_to(results.parent)}: report.py's {name} renderer does not read it")
    return "\n".join(strip_blank_runs(lines)).rstrip() + "\n"


def render_folder(name: str, folder: Folder) -> list[str]:
    """One folder's section; a value of the wrong kind (text where a table was expected) is one line too."""
    try:
        return RENDERERS[name](folder)
    except (TypeError, AttributeError, ValueError, ZeroDivisionError) as error:
        raise ReportError(
            f"{folder.rel}/: a value is not of the kind report.py reads ({type(error).__name__}: {error})"
        ) from None


def anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, spaces to dashes, punctuation dropped."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def strip_blank_runs(lines: list[str]) -> list[str]:
    """No two blank lines in a row (parts that render nothing leave one)."""
    out: list[str] = []
    for line in lines:
        if not (line == "" and out and out[-1] == ""):
            out.append(line)
    return out


def write_atomically(path: Path, text: str) -> None:
    """A temp file beside the page, then a rename: a reader never sees half a page."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's file is private; the page is not
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if benchmarks/README.md is not what this writes")
    args = parser.parse_args(argv)
    try:
        page = render(RESULTS)
    except ReportError as error:
        print(f"report.py: error: {error}", file=sys.stderr)
        return 1
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(
                "report.py: benchmarks/README.md is not what the results give: run python benchmarks/report.py",
                file=sys.stderr,
            )
            return 1
        return 0
    write_atomically(PAGE, page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
