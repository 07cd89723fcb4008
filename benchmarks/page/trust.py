"""Trust: lying peers beside honest ones, how many windows a spot check needs, what an identity costs, and fuzzing."""

from __future__ import annotations

from .formatting import (
    DASH,
    command,
    fixed,
    heading,
    parts,
    plain,
    section,
    settings,
    size,
    table,
    times,
    with_later_runs,
    yes,
)
from .reading import Folder, Node


def attacks(folder: Folder) -> list[str]:
    """attacks.json and the runs kept beside it (a later run of some rows, on a swarm of its own)."""
    return with_later_runs(
        folder,
        attacks_run,
        "Runs each attack beside a clean run on a small model in separate processes on 127.0.0.1 (the attacks and "
        "their bounds: `benchmarks/attacks.py`). Part 1: a trained swarm of two blocks and one liar at a time, then a "
        "fetch, a joiner and generation through the swarm. Part 2: one block, one hostile replica beside three honest "
        "ones, then beside two; the honest replicas' loss over a clean run of the same honest replicas. Part 3, "
        "where run: one honest replica beside a stranger, over the same replica alone.",
    )


def attacks_run(folder: Folder, title: str) -> list[str]:
    """One attacks.json: its command and settings, a table per part it ran, and whether every row was met."""
    a = folder.json("attacks.json")
    config, model, options = a["config"], a["model"], a.get("peer_options")
    met = a.get("met")
    trained = a.get("training") is not None or a.get("two_replicas") is not None
    return heading(title) + parts(
        command("attacks.py", {"parts": config["parts"], **({"rows": config["rows"]} if config.get("rows") else {})}),
        settings(config, {"parts", "rows"}),
        settings(model, label="Model"),
        f"Honest peers' options beyond their defaults: `{plain(options)}`." if options is not None else "",
        plain(a.get("note") or ""),  # why a run was made, where it is not the whole benchmark
        attack_fetches(a["fetch_and_serve"]) if a.get("fetch_and_serve") is not None else [],
        f"Loss: {plain(a['loss'])}." if a.get("loss") is not None and trained else "",  # parts 2 and 3's
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
    header = ["part 1", f"fetched {figure} / clean", "fetched steps", "joiner's step",
              "generation used clean checkpoints", "generation = local", "banned", "honest peak RSS / clean",
              "honest peers up", "met"]  # fmt: skip
    return table(header, lines) + [crashed, ""]


def attack_training(part: Node) -> list[str]:
    rows = [[plain(run["attack"]), plain(run["value_bits"]), plain(run["honest_replicas"]),
             fixed(run.num("validation_loss")),
             times(run.get("honest_loss_over_clean")), plain(run.get("final_steps")), plain(run.get("merged")),
             honest_peers(run)[0], plain(run["honest_crashed"]), yes(run["hung"]), yes(run.get("met"))]
            for _, run in part.items() if isinstance(run, Node)]  # fmt: skip
    header = ["part 2: attack", "value bits", "honest replicas", "loss", "honest loss / clean", "final steps", "merges",
              "peak RSS / clean", "crashed", "hung", "met"]  # fmt: skip
    return table(header, rows)


def attack_two_replicas(part: Node) -> list[str]:
    rows = [[plain(run["attack"]), fixed(run.num("validation_loss")), times(run.get("loss_over_lone")),
             times(run.get("seconds_per_step_over_lone")), fixed(run.get("weight_distance_over_travel")),
             plain(run["final_steps"]), honest_peers(run)[0], yes(run["hung"]), yes(run["met"])]
            for _, run in part.items() if isinstance(run, Node)]  # fmt: skip
    header = ["part 3: beside the replica", "loss", "loss / alone", "seconds a step / alone",
              "weight distance / travel", "final step", "peak RSS / alone", "hung", "met"]  # fmt: skip
    start = f"The start weights' loss: {fixed(part.num('start_loss'))}."
    return table(header, rows) + [start, ""]


def spot_check_noise(folder: Folder) -> list[str]:
    r = folder.json("spot_check_noise.json")
    rows = [[plain(count), fixed(row.num("mean_difference")), fixed(row.num("se_difference")),
             fixed(row["se_difference_by_source"].num("train")),
             fixed(row["se_difference_by_source"].num("validation")),
             fixed(row.num("se_score")), fixed(row.num("seconds_per_measure"), 2)]
            for count, row in r["windows_per_source"].items()]  # fmt: skip
    return section(
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


def identity_cost(folder: Folder) -> list[str]:
    c = folder.json("identity_cost.json")
    config, reader, at = c["config"], c["reader"], c["at_recommended"]
    rows = [[plain(e["bits"]), plain(e["expected_tries"]), fixed(e.num("core_seconds"), 0),
             fixed(e.num("core_seconds") / 3600, 2)] for e in c["expected"]]  # fmt: skip
    solved = ", ".join(plain(s["tries"]) for s in c["small_solves"])
    return section(
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
        f"{plain(reader['flood_records'])} new records with bad nonces checked "
        f"{plain(reader['flood_records_checked'])} "
        f"of them, in {fixed(reader.num('flood_read_seconds'), 3)} s.",
        f"At the recommended price, {plain(at['bits'])} bits: an honest joiner pays "
        f"{fixed(at.num('honest_joiner_core_seconds'), 0)} s of one core, once per key and peer id; "
        f"{plain(at['sybils'])} Sybil identities cost an attacker {fixed(at.num('attacker_core_seconds'), 0)} s "
        f"({fixed(at.num('attacker_core_hours'), 2)} core hours).",
    )  # fmt: skip


def fuzz(folder: Folder) -> list[str]:
    """fuzz.json: messages per handler of the live peers and inputs per decoder, and what came of them."""
    f = folder.json("fuzz.json")
    handlers = [[f"`{name}`", plain(h["messages"]), plain(h["answers"]), plain(h["error_replies"]),
                 plain(h["of_them_envelopes_hivemind_refused"]), plain(h["raised"]), plain(h["hangs"])]
                for name, h in f["handlers"].items()]  # fmt: skip
    decoders = [[f"`{name}`", plain(d["messages"]), plain(d["accepted"]), plain(d["refused"]),
                 plain(sum(d["other"].data.values()))] for name, d in f["decoders"].items()]  # fmt: skip
    findings = [f"- `{plain(x['target'])}`: {plain(x['outcome'])} ({plain(x['strategy'])})" for x in f["findings"]]
    return section(
        "Sends malformed, huge, truncated, wrong-type and out-of-range messages to every P2P handler of live "
        "`swarm-peer`s on 127.0.0.1, one per block of a small model (random bytes; each handler's valid request with "
        "bits flipped, cut short, extended, a huge length prefix spliced in, fields of the wrong type, out of range, "
        "NaN or inf, huge or deeply nested, tensors of the wrong dtype or shape or whose fields lie), then the same "
        "kinds of input to every decoder of a peer's bytes in one process. A crash is a handler that raised, a "
        "decoder that raised another error than its own or gave back a value out of its bounds, a peer that died or "
        "logged a traceback; a hang is a call not answered within its handler's timeout, a valid `rpc_info` a peer "
        "did not answer (asked every few seconds throughout), or a decode slower than 10 s. An envelope hivemind "
        "refused is bytes that are no protobuf of the handler's: hivemind answers for it, and no handler of ours "
        "sees it.",
        command("fuzz.py", {}), settings(f["config"], {"weights", "peer_options"}), settings(f["model"], label="Model"),
        f"{plain(f['messages'])} messages: {plain(f['live_messages'])} to the live peers in "
        f"{fixed(f.num('live_seconds'), 0)} s ({fixed(f.num('live_messages_per_second'), 0)} a second), "
        f"{plain(f['decoder_messages'])} to decoders. Crashes: {plain(f['crashes'])}. Hangs: {plain(f['hangs'])}.",
        table(["handler", "messages", "answers", "error replies", "of them, envelopes hivemind refused", "raised",
               "hangs"], handlers),
        table(["decoder", "inputs", "accepted", "refused", "anything else"], decoders),
        ["What went wrong, first of each kind:", "", *findings, ""] if findings else "",
    )  # fmt: skip


def sync_vote(folder: Folder) -> list[str]:
    """sync_vote.json: honest replicas' votes (set aside or not, parted or not) and one replica beside free keys."""
    v = folder.json("sync_vote.json")
    honest = [honest_vote(mode, run) for mode, runs in v["honest"].items() for run in runs]
    attacked = [[mode, plain(name), fixed(row.num("loss_over_alone")), yes(row["met"]), plain(row["on_own_alone"])]
                for mode, rows in v["attacks"].items()
                for name, row in rows.items() if isinstance(row, Node)]  # fmt: skip
    return section(
        "The sync vote of three senders or more, in one process (the optimizers the peers run, no network): a replica "
        "sets aside a vote that keeps no more than a tenth of its update, of its sizes or in its direction (the "
        "cosine; `swarm/sync/evidence.py` `keeps_own`), and an outer replica one that measures worse than its own "
        "change alone by more than 6 standard errors on a private held-out batch (`swarm/sync/descent.py`). "
        "Honest: n replicas of one "
        "block on their own batches, every payload gathered by every replica (parted: the first step, or outer "
        "round, after which they no longer held the same weights; none: never). Attacks: one replica beside k free "
        "keys that send its own payload turned against it, its validation loss over the same replica's alone (issue "
        "57's bound: 1.05), and the steps (outer: rounds) it took on its own update alone.",
        command("sync_vote.py", {}),
        settings(v["settings"]),
        table(["mode", "replicas", "steps or rounds", "votes set aside", "parted at", "least share kept"], honest),
        table(["mode", "what the keys send", "loss over alone", "met", "on its own alone"], attacked),
    )


def honest_vote(mode: str, run: Node) -> list[str]:
    """One honest run's row: an outer run counts rounds, a DeMo run steps."""
    unit = "round" if mode == "outer" else "step"
    return [mode, plain(run["replicas"]), plain(run[f"{unit}s"]), plain(run["votes_set_aside"]),
            plain(run[f"first_parted_{unit}"]), fixed(run.num("least_kept_share"))]  # fmt: skip
