"""Attacks on an open swarm, each beside a clean run, on default peer settings: what honest fetches,
joiners, generation and training end up with when one stranger lies (the liars are in
swarm/lab/attacks.py; issue 26 numbers the attacks it found, "item N" below).

Honest peers run with `swarm-peer`'s defaults (DeMo sync, merges of drifted replicas every
`--average-every` steps, announce period, sync deadline, ...) but for these options:
- `--max-steps` (this script's --steps, --train-steps), `--save-every` and `--batch-size 16`,
  with a small model: a budget that fits 2 cores;
- `--wait-for-replicas N` where N replicas train together: they start at once, from the same weights;
- `--value-bits 1` in the 1-bit runs of part 2;
- `--identity` in part 3: the honest replica keeps one peer id across runs, so it draws the same
  batches (a replica's batches are seeded by its peer id) alone and beside a stranger;
- `--average-every`, only where this script's --average-every is not the peer's default (a quick run).
The liars that are `swarm-peer`s (the step liars) run `--max-steps 1 --announce-period 1`, a joiner
`--max-steps 1`.

Part 1, one trained swarm: block 0 with one honest host (b0), block 1 with two DeMo replicas
(b1r0, b1r1) and a copy of their checkpoint (b1copy); one liar at a time, removed after each:
- step_lie_garbage_block: a swarm-peer serving a blown-up block 1 stamped with step 999999;
- step_lie_poisoned_block: a swarm-peer serving a poisoned block 1 (the last block: the least masked, whose noise
  levels see word order) one save ahead of its honest hosts. Poisoned: the clean fetch's block with noise in
  every weight, scaled so that the spot check measures it 0.5 nats per byte worse (`degraded_block`): finite,
  better than a uniform guess, so only its comparison with the honest candidate can refuse it (the row records
  both spot-check losses). A block trained on shuffled characters was no poison at this budget: as block 0 it
  measured better than the honest one, and a fetch and a joiner took it (docs/history.md);
- sybil_keys_vouching_poisoned_block (issue 27): --sybils keys (20), each a node in this process with its own
  key and peer id, announcing and serving (for download and denoising) one poisoned block 0 a save ahead of b0,
  its lone honest host. At the defaults an identity costs nothing, so a generation client counts no keys there:
  it measures every checkpoint of a block before using any (`SwarmDirectory.keys_count`), as a fetch does;
- sybil_keys_in_members_only_swarm, sybil_keys_in_identity_work_swarm: the same Sybils (no certificate, no
  work) in a swarm of the same model created with `--members-only`, or with `--identity-work` 6 (cheap for the
  honest peers here; its price at 12 bits is benchmarks/identity_cost.py's), whose blocks one honest peer each
  hosts from part 1's checkpoints (members where members-only), measured with fetch, joiner and generation;
- nan_weight_block, nan_loss_block (item 5): a block 0 with a NaN weight, or with finite weights
  whose loss is NaN, one save ahead of b0, served for download under one key;
- one_record_ahead (item 6): one key announcing a garbage block 0 at b0's step + 1, served for
  download, and answering denoise requests wrongly;
- oversized_announcement: a record of a newer block 1 of 8 GiB, served a byte a second;
- model_record_hijack: another valid config written under `S.model` by a stranger's key;
- wrong_denoise_answers: a key vouching for block 1's honest checkpoint, answering wrongly;
- honest_then_lying_beside_two_keys, _beside_one_key (item 7): a key vouching for the honest
  checkpoint of block 1 (two honest keys) or block 0 (one) that answers its first request
  honestly, then lies;
- free_keys_outvote_lone_host (issue 57): k = 2, 4 and 8 free keys announcing b0's checkpoint, serving
  its true file, and answering every denoise request with one set of wrong weights, all alike (counted
  as keys, a majority against b0). Generation at each k; met also where the generation client's
  attestation credits no hostile key and no honest key less than in the clean row (every row's client
  now reports what it credits, `credited`, with audit draws seeded alike, `AUDIT_SEED`);
- chunk_list_stall_beside_fast_poison (issue 57): at k = 2, 4 and 8 free keys, k - 1 keys announce b0's
  checkpoint under their own keys and answer every chunk list and download "busy" just before the
  timeout (`BusyJustInTime`), and one more serves a poisoned block 0 (step_lie_poisoned_block's kind of
  poison) a save ahead at full speed, for download and denoising. A fetch, a joiner and generation at
  each k (`by_keys`, each met as a row is; the row's bits per byte over clean is its worst k's), which
  checkpoint the fetch took (`fetch_took`), and the stallers' chunk lists asked and answered.
Issue 46's strangers, who have read how we measure:
- spot_check_tuned_0.05 .. _1.0: block 1 made that many nats per unit worse on held-out text, then
  tuned on the windows and draws of a spot check with public seeds (the old check's 32 windows, of
  each split) until that check scores it better than the honest block; one save ahead, under one
  key, for download and denoising (`tuned_block`);
- step_inflation: block 1's honest weights bit for bit, stamped 2 x step + 100 (met only if the
  joiner starts at the honest step);
- honest_weights_restamped_lying_answers: block 0's honest weights (its lone host's) stamped a save
  ahead, under one key that answers denoise requests wrongly;
- slightly_worse_every_save: a copy of every block 0.099 nats per unit worse on held-out text (within
  the tolerance), a save ahead, each under its own key, for download and denoising;
- laundered_block: step_lie_poisoned_block's poisoned block 1, a save ahead, served for download and
  denoising under one key, and bit for bit under a second whose record says it took it from the first
  alone (`taken_from`), as an honest joiner that adopted it would announce: a second key, not a second
  voice. The row records the keys and the independent vouchers the client counts for it;
- flood_of_distinct_checkpoints: MEASURED_AT_MOST + 8 (40) keys, each announcing and serving, at full
  speed, a distinct copy of a poisoned block 0 (`distinct_copies`) a save ahead of b0, its lone honest
  host: ranked by step, b0 comes past what a choice measures unless the ledger credits its key
  (`backed_keys`). The row records whether it does, b0's place in the order of measurement and the
  fetch's seconds. A slow flood is tests/test_evidence.py's
  test_a_flood_of_slow_checkpoints_costs_a_choice_seconds_not_minutes.
For each: the fetched model's bits per byte (the ELBO on 256 fixed validation windows, at a seed
of their own that no stranger here tunes to) over the clean fetch's, met at <= 1.02; the
checkpoint a joiner starts from (met if not the liar's, and for step_inflation at the honest step;
a tuned row whose block is no worse on the stranger's own held-out windows says so in
attack_made_no_worse_block, and is still met only as the others are); generation
through the swarm (preferring the liar): the checkpoints whose answers it used, per block (met if
only the clean fetch's: a poisoned block may change no argmax, so equal text alone proves nothing),
its text against local generation from the clean fetch (met if equal: a liar vouching for the
honest checkpoint can only change answers), and bans; the honest peers' peak RSS during the row
over the clean row's; every honest peer alive with a recent record (met).

Part 2, one hostile replica beside honest ones (block 0, all from the same start for the same
steps), in two layouts, each against the clean run of the same honest replicas: three honest beside
the stranger against three honest alone (the issue's figure: what the attack costs a block of three
honest replicas), and two honest beside it against two honest alone (the hardest majority: one voice
in three). The stranger sends its own update negated, at the largest values allowed, or with random
signs (at 16 and 1 bits), answers sync polls with garbage and a step of 10^12, sends payloads every
replica refuses under a fingerprint that says they drifted (item 2: no merge is forced), or sends
honest payloads and brings a poisoned checkpoint to the merge round at the merge step (item 1:
reconcile.py). For each: the honest replicas' loss (block 0's share of the bound in bits per byte,
validation windows) over the clean run's, met at <= 1.03 with every step done and none jumped; drift
noticed, merges, refused payloads (counted in the honest logs); the largest honest weight; peak RSS
over the clean run's; crashed or hung. (Two honest beside a stranger against three clean measure a
lost replica's batches, not the attack: 1.045x for two honest alone, docs/history.md.)

Part 3, two-replica blocks (items 3, 4): one honest replica alone, and the same replica (same
peer id, same batches) beside a stranger whose every sync reply claims step 10^12, or that sends
its own DeMo update negated each step. Met when the honest replica does every step and no more,
and its loss is within 1.03x of the lone run's (neither frozen nor moved); beside it, the distance
of its weights from the lone run's over the lone run's distance from the start weights.
- jump_every_step (issue 57): the same replica beside k = 2, 4 and 8 free keys, each answering every
  other sync poll with "gone, the newest step is the one asked plus 1000" and the others with junk in
  time (`JumpClaims`; the junk is refused, and from then on no gather waits for them), a majority
  ahead from its first claim on (a "gone" answer stands until the replica's step nears the step it
  named: swarm/sync/transport.py).
  Figures at each k (`jump_every_step_<k>keys`): the steps it trained and its final
  step (its jumps' budget bounds the difference: swarm/sync/exchange.py), its loss over the lone
  run's (met at <= 1.05) and its seconds per step over the lone run's (met at <= 1.5, both read off
  its log's clock from its first step to its last save).
- negated_echo_every_step, empty_payloads_every_step (issue 57): the same replica beside k = 2, 4
  and 8 free keys that fetch its payload of each step and answer with it negated (`NegatedEcho`), or
  answer at once with a payload that decodes to nothing (`EmptyPayloads`): a majority of its vote,
  which a vote that counted keys stepped up its loss, or froze (swarm/sync/evidence.py
  `keeps_own`). Figures and bounds as jump_every_step's (`<row>_<k>keys`).

    python benchmarks/attacks.py            # about 55 minutes on 2 cores (part 1 about 25)
    python benchmarks/attacks.py --steps 20 --train-steps 20 --save-every 10 --average-every 10 \\
        --out /tmp/attacks-smoke            # a smoke run of every row (its figures mean little)
    python benchmarks/attacks.py --parts 1 --steps 20 --save-every 10 --rows step_inflation \\
        --out /tmp/attacks-smoke            # a smoke run of part 1's clean row and one row
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from datetime import datetime
from pathlib import Path

from hivemind.utils import get_dht_time

from swarm.checkpoints.choice import MEASURED_AT_MOST, SpotCheck, rank, uniform_ce
from swarm.checkpoints.download import independent
from swarm.checkpoints.store import CheckpointStore
from swarm.checkpoints.transfer import BlockServicer
from swarm.cli.console import setup_logging
from swarm.files import write_atomic, write_picture
from swarm.lab.attacks import (
    STEP_LIE,
    BusyJustInTime,
    EmptyPayloads,
    HonestThenWrong,
    HostileNode,
    HostileReplica,
    JumpClaims,
    LyingSyncReplies,
    MergePoisoner,
    NegatedEcho,
    RefusedPayloads,
    TricklingDownloads,
    WrongAnswers,
    checkpoint_of,
    degraded_block,
    distinct_copies,
    garbage_block,
    nan_weight_block,
    overflowing_block,
    plant_checkpoint,
    serving_nodes,
    sybil_nodes,
    tuned_to,
)
from swarm.lab.launch import LocalSwarm, Started
from swarm.model.checkpoint import load_block, load_model_folder
from swarm.model.data import load_corpus
from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.model.evaluate import block_elbo_bits, elbo_bits_per_byte
from swarm.model.families import local_runner
from swarm.model.generate import continue_text
from swarm.model.train import TrainConfig, block_trainer
from swarm.p2p.client import SwarmClient
from swarm.p2p.directory import DHTUnavailable
from swarm.p2p.info import InfoServicer
from swarm.p2p.ledger import backed_keys
from swarm.p2p.records import CheckpointInfo, owner_fingerprint
from swarm.peer.announcer import RECORD_LIFETIME_PERIODS
from swarm.peer.config import PeerConfig
from swarm.serving.audit import LoneKeyAudit
from swarm.serving.remote import RemoteBlocks
from swarm.serving.server import DenoiseServicer
from swarm.sync.exchange import JUMP_SHARE, allowance_for
from swarm.waiting import WaitTimeout, wait_for

logger = logging.getLogger("benchmarks.attacks")

SMALL = {"prefix_len": 32, "gen_len": 16, "d_model": 64, "n_heads": 2, "n_layers": 4, "n_blocks": 2}
BATCH_SIZE = 16
VALIDATION_WINDOWS = 256
PROMPT = b"The history of the city"
GENERATED_BYTES = 64
PEER = PeerConfig()  # the defaults every honest peer keeps
POISON_WORSE_BY = 0.5  # nats per byte a poisoned block loses on the spot check (5x its tolerance)
TUNED_GRADES = (0.05, 0.1, 0.25, 0.5, 1.0)  # nats per unit a block tuned to a public check loses on held-out text
SLIGHTLY_WORSE = 0.099  # nats per unit: just within the spot check's tolerance
FLOOD_BEYOND_BOUND = 8  # keys of the flood row beyond what a choice measures (`MEASURED_AT_MOST`)
FREE_KEYS = (2, 4, 8)  # the free keys of issue 57's rows (up to 8)
AUDIT_SEED = 57  # the seed of every row's generation client's audit draws, alike so that credits compare
PUBLIC_SEED = 1234  # the seed of the old spot check's windows, which anyone could compute
HELD_OUT_SEED = 2046  # the held-out windows an attacker grades its block on (no check of ours uses a fixed seed)
EVALUATION_SEED = 4242  # the windows every figure here is measured on: none of PUBLIC_SEED's or HELD_OUT_SEED's
SYBIL_WORK_BITS = 6  # the identity work of the Sybil row's priced swarm: cheap for the honest peers here
# (its price at 12 bits: benchmarks/identity_cost.py); the Sybils do none
QUALITY_BOUND = 1.02  # the fetched model's bits per byte over the clean fetch's
LOSS_BOUND = 1.03  # the honest replicas' loss over the clean run's
ALONE_LOSS_BOUND = 1.05  # issue 57: an honest replica's loss beside free keys over its loss alone
ALONE_SECONDS_BOUND = 1.5  # issue 57: its seconds per step beside them over alone
RECENT_S = 2 * PEER.announce_period + 5  # a record older than this: its peer missed announcements
LIAR_PEER = ["--max-steps", "1", "--announce-period", "1"]
LOSS = "block 0's share of the bound on validation windows, bits per byte"
LOG_COUNTS = {  # lines of the honest replicas' logs counted in parts 2 and 3 (sync/exchange.py, reconcile.py)
    "drift_noticed": "the next merge will reconcile them",
    "merged": "merged the replicas' checkpoints",
    "merges_weights_kept": "weights kept",
    "payloads_refused": "refused the step",
    "jumps": "jumping from",
}
Honest = list[tuple[Started, int]]  # an honest peer and its block


def peer_options(args, steps: int, replicas: int = 1, value_bits: int = PEER.de_mo.value_bits) -> list[str]:
    """What an honest peer is told beyond its defaults (the module docstring says why)."""
    options = ["--max-steps", str(steps), "--save-every", str(args.save_every), "--batch-size", str(BATCH_SIZE)]
    if replicas > 1:
        options += ["--wait-for-replicas", str(replicas)]
    if value_bits != PEER.de_mo.value_bits:
        options += ["--value-bits", str(value_bits)]
    if args.average_every != PEER.average_every:
        options += ["--average-every", str(args.average_every)]
    return options


def hosts_of(client: SwarmClient, block: int, state: str = "serving") -> list:
    return [h for h in client.directory.hosts(block) if h.announcement.state == state]


def write_config(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "small.json"
    path.write_text(json.dumps(SMALL))
    return path


def honest_health(client: SwarmClient, honest: Honest) -> dict:
    """Every honest peer alive, with a record stored in the last two announce periods (each peer's
    record age, the peers without a recent one, and the blocks whose record could not be read at
    all, are named); their largest peak RSS (peer and children) since it was last reset."""
    lifetime, ages, peaks, unreadable = RECORD_LIFETIME_PERIODS * PEER.announce_period, [], [], set()
    for handle, block in honest:
        peaks.append(handle.peak_rss() or 0)
        try:
            records = [h for h in client.directory.hosts(block) if h.announcement.public_name == handle.name]
        except DHTUnavailable:
            records = []
            unreadable.add(block)
        ages.append(lifetime - (max(h.expires_at for h in records) - get_dht_time()) if records else None)
    alive = sum(handle.process.poll() is None for handle, _ in honest)
    named = {handle.name: age for (handle, _), age in zip(honest, ages, strict=True)}
    stale = [name for name, age in named.items() if age is None or age > RECENT_S]
    recent = len(honest) - len(stale)
    return {"peers": len(honest), "alive": alive, "recent_records": recent, "without_recent_record": stale,
            "record_age_s": named,  # None: no record of the peer read at all
            "blocks_unreadable": sorted(unreadable),
            "oldest_record_s": max((a for a in ages if a is not None), default=None),
            "peak_rss_mb": max(peaks, default=0) / 2**20, "ok": alive == recent == len(honest)}  # fmt: skip


def beside_clean(health: dict, clean: dict) -> dict:
    health["peak_rss_over_clean"] = health["peak_rss_mb"] / clean["peak_rss_mb"] if clean["peak_rss_mb"] else None
    return health


def guarded(name: str, run: Callable[[], dict]) -> dict:
    """One row; a row that fails is recorded as failed (and not met), and the others still run."""
    logger.info("row: %s", name)
    try:
        return run()
    except Exception as error:  # a long run should not end on one row
        logger.exception("row %s failed", name)
        return {"error": f"{type(error).__name__}: {error}"[:300]}


# ---- part 1: a trained swarm, one liar at a time -------------------------------------------


@dataclasses.dataclass
class Swarm:
    """Part 1's trained swarm, and the clean fetch every row is measured against."""

    args: argparse.Namespace
    workdir: Path
    local: LocalSwarm
    client: SwarmClient
    config: ModelConfig
    reference: object = None  # the clean fetch (an assembled model folder, loaded)
    invite: Callable[[str], list[str]] = lambda name: []  # the options a fetch or joiner `name` joins with

    def honest_checkpoint(self, block: int) -> CheckpointInfo:
        """The checkpoint of `block` the clean fetch took, as its hosts announce it."""
        sha256 = self.reference.manifest["blocks"][str(block)]["sha256"]
        return next(h.announcement.checkpoint for h in hosts_of(self.client, block)
                    if h.announcement.checkpoint and h.announcement.checkpoint.sha256 == sha256)  # fmt: skip

    def honest_file(self, info: CheckpointInfo) -> bytes:
        """The bytes of the honest checkpoint `info`, from a peer's folder that holds them."""
        for path in self.local.workdir.glob(f"*/block_*_step_{info.step}.safetensors"):
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() == info.sha256:
                return data
        raise FileNotFoundError(f"no peer's folder holds checkpoint {info.sha256[:12]}")

    @contextlib.contextmanager
    def stranger(self, block: int) -> Iterator[HostileNode]:
        """A liar's node for one row, whose record of `block` says it left once the row is over."""
        with HostileNode(self.local.swarm, self.local.initial_peers) as node:
            try:
                yield node
            finally:
                node.leave(block)

    def wait_for_record(self, block: int, peer_id: str) -> None:
        wait_for(lambda: peer_id in {h.peer_id for h in self.client.directory.hosts(block)}, 30, "the liar's record")


def trained_swarm(args, local: LocalSwarm, client: SwarmClient) -> Honest:
    """Block 0 with one honest host; block 1 with two DeMo replicas, then a copy of their checkpoint."""
    honest = [(local.start_peer("b0", "0", peer_options(args, args.steps)), 0)]
    honest += [(local.start_peer(f"b1r{r}", "1", peer_options(args, args.steps, replicas=2)), 1) for r in range(2)]
    wait_for(lambda: len(hosts_of(client, 0)) == 1 and len(hosts_of(client, 1)) == 2, args.timeout,
             "every replica to finish", interval=2.0)  # fmt: skip
    # a third host of block 1 that starts from the checkpoint the others agree on: replicas of
    # one checkpoint, which a generation client can check against each other
    honest.append((local.start_peer("b1copy", "1", peer_options(args, args.steps)), 1))
    wait_for(lambda: len(hosts_of(client, 1)) == 3, args.timeout, "the copy of block 1", interval=2.0)
    return honest


def fetch(local: LocalSwarm, name: str, windows, join: list[str] = ()) -> dict:
    started = time.monotonic()
    result = local.run("swarm-fetch", "--out", name, *join, timeout=900)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        return {"fetched": False, "error": result.stderr.strip().splitlines()[-1:], "seconds": seconds}
    model = load_model_folder(local.workdir / name)
    blocks = [model.manifest["blocks"][str(b)] for b in range(model.config.n_blocks)]
    return {"fetched": True, "seconds": seconds,
            "bits_per_byte": elbo_bits_per_byte(model.denoiser_for_block, model.config, windows)["overall"],
            "steps": [b["step"] for b in blocks], "sha256": [b["sha256"][:12] for b in blocks],
            "spot_check_seconds": model.manifest.get("spot_check_seconds")}  # fmt: skip


def joiner_start(local: LocalSwarm, client: SwarmClient, block: int, name: str, liar_sha256s: Collection[str],
                 join: list[str] = ()) -> dict:  # fmt: skip
    """Start a fresh replica of `block` and report the checkpoint it started from (`from_liar`: one of
    `liar_sha256s`)."""
    joiner = local.start_peer(name, str(block), ["--max-steps", "1", *join])
    try:
        found = wait_for(lambda: [h for h in client.directory.hosts(block) if h.announcement.public_name == name
                                  and h.announcement.state != "joining"], 180, f"joiner {name}")[0]  # fmt: skip
    finally:
        local.stop(joiner)
    checkpoint = found.announcement.checkpoint
    sha256 = checkpoint.sha256 if checkpoint else None
    return {"step": checkpoint.step if checkpoint else None, "sha256": sha256, "from_liar": sha256 in liar_sha256s}


def generation(swarm: Swarm, liar: str | Collection[str] | None = None, liar_sha256s: Collection[str] = ()) -> dict:
    """Text through the swarm against the same text from the clean fetched model, here, and the
    checkpoints whose answers it used (`RemoteBlocks.used`): met only if every block used the clean
    fetch's checkpoint alone (not the liar's) and the text is equal (a liar vouching for the honest
    checkpoint can only change answers). Equal text alone proves nothing: a degraded block may
    change no argmax. `liar`: the peer id of each liar, which the client prefers (the fastest).
    Also what the client's attestation credits (`credited`). The client's audit (audit.py) draws at
    its default rate from a generator seeded alike in every row (`AUDIT_SEED`, one draw per answer),
    so that an honest key's credit in a row compares with the clean row's; no liar here reads it."""
    config, client = swarm.config, swarm.client
    liars = {liar} if isinstance(liar, str) else set(liar or ())
    runner = RemoteBlocks(client.directory, client.p2p, client.loop, config, request_timeout=20,
                          witness=client.witness(), audit=LoneKeyAudit(draws=random.Random(AUDIT_SEED)))  # fmt: skip
    for block in range(config.n_blocks):  # the worst case: the liars are the replicas the client prefers
        for host in client.directory.hosts(block):
            if host.peer_id in liars:
                runner.replicas.rtt[host.peer_id, host.owner] = 0.0
    started = time.monotonic()
    text = b"".join(continue_text(runner, config, PROMPT, GENERATED_BYTES, steps_per_block=2, seed=1))
    seconds = time.monotonic() - started
    local = local_runner(swarm.reference.denoiser_for_block, config)
    expected = b"".join(continue_text(local, config, PROMPT, GENERATED_BYTES, steps_per_block=2, seed=1))
    clean = [{swarm.reference.manifest["blocks"][str(b)]["sha256"]} for b in range(config.n_blocks)]
    used = [runner.used.get(b, set()) for b in range(config.n_blocks)]
    result = {"checkpoints_used": [sorted(sha[:12] for sha in shas) for shas in used],
              "used_only_clean_checkpoints": all(shas and shas <= c for shas, c in zip(used, clean, strict=True)),
              "equals_clean_local_generation": text == expected, "seconds": seconds, "cross_check": vars(runner.checks),
              "credited": credited(swarm, runner, liars)}  # fmt: skip
    if liar_sha256s:
        result["used_liars_checkpoint"] = any(not shas.isdisjoint(liar_sha256s) for shas in used)
    if liars:
        result["liar_banned"] = liars <= set(runner.replicas.banned_until)
    return result


def credited(swarm: Swarm, runner: RemoteBlocks, liars: Collection[str]) -> dict:
    """The answers the generation client's attestation credits (swarm/p2p/ledger.py): `honest`, each
    host's key but the liars' by its public name, and `hostile`, those of every other key (the
    liars'); `honest_banned_for_good`, the honest hosts this client showed wrong."""
    attestation = runner.witness.attestation()
    answers = {c.subject: c.answers for c in attestation.contributions} if attestation else {}
    hosts = [h for b in range(swarm.config.n_blocks) for h in swarm.client.directory.hosts(b) if h.peer_id not in liars]
    honest = {owner_fingerprint(h.owner): h for h in hosts if h.owner and h.announcement.public_name}
    for_good = {peer for peer, until in runner.replicas.banned_until.items() if until == math.inf}
    shown_wrong = sorted(h.announcement.public_name for h in honest.values() if h.peer_id in for_good)
    return {"honest": {h.announcement.public_name: answers.get(key, 0) for key, h in honest.items()},
            "hostile": sum(count for key, count in answers.items() if key not in honest),
            "honest_banned_for_good": shown_wrong}  # fmt: skip


def measured(swarm: Swarm, name: str, block: int, liar_sha256s: Collection[str] = (), joiner: bool = True,
             liar_peer: str | Collection[str] | None = None, generate: bool = False) -> dict:  # fmt: skip
    """While a liar is up: a fetch, a joiner of `block` and generation through the swarm, as asked;
    `liar_sha256s`: the liars' checkpoints (one, or a flood's), which the joiner and generation must not take;
    `liar_peer`: the liar's peer id, or several liars'."""
    row = {"fetch": fetch(swarm.local, f"{name}-fetch", swarm.args.windows, swarm.invite(f"{name}-fetch"))}
    if joiner:
        joining = f"{name}-joiner"
        row["joiner"] = joiner_start(swarm.local, swarm.client, block, joining, liar_sha256s, swarm.invite(joining))
    if generate:
        row["generation"] = generation(swarm, liar_peer, liar_sha256s)
    return row


def poisoned(swarm: Swarm, block: int) -> tuple[Denoiser, dict]:
    """A poisoned block: the clean fetch's `block` made `POISON_WORSE_BY` nats per byte worse on the
    spot check (`degraded_block`), and both losses as a fetcher's spot check measures them."""
    config, spot_check = swarm.config, SpotCheck.from_source(None, swarm.config)
    honest = swarm.reference.denoiser_for_block(block)
    poison = degraded_block(honest, lambda denoiser: spot_check.measure(denoiser, config, block), POISON_WORSE_BY)
    return poison, {"honest_spot_check_ce": spot_check.measure(honest, config, block),
                    "poison_spot_check_ce": spot_check.measure(poison, config, block),
                    "uniform_ce": uniform_ce(config)}  # fmt: skip


def step_lie(swarm: Swarm, name: str, poison: bool) -> dict:
    """A swarm-peer serving, as block 1 (the last block: the least masked, whose noise levels see
    word order), a garbage block stamped 999999, or a poisoned one a save ahead of its honest hosts."""
    args, local, config, block, figures = swarm.args, swarm.local, swarm.config, 1, {}
    if poison:
        denoiser, figures = poisoned(swarm, block)
        step = swarm.honest_checkpoint(block).step + args.save_every
    else:
        denoiser, step = garbage_block(config, block), STEP_LIE
    plant_checkpoint(local.workdir / name, denoiser, config, block, step, local.swarm)
    liar = local.start_peer(name, str(block), LIAR_PEER)
    try:
        record = wait_for(lambda: [h for h in hosts_of(swarm.client, block) if h.announcement.step == step], 120,
                          f"{name} announcing")[0]  # fmt: skip
        row = measured(swarm, name, block, liar_sha256s={record.announcement.checkpoint.sha256})
        return {"block": block, "liar_step": step, **figures, **row, "liar_alive": liar.process.poll() is None}
    finally:
        local.stop(liar)


def records_read(swarm: Swarm, block: int, nodes: list[HostileNode]) -> tuple[int, int]:
    """Once the client has read as many records of `block` as `nodes` has (theirs counted, or any ignored:
    a members-only swarm's reader ignores a non-member's), how many of theirs it counts, and how many of
    the block's records it ignores."""
    peer_ids = {node.peer_id for node in nodes}

    def read() -> tuple[int, int]:
        hosts, ignored = swarm.client.directory.census(block)
        return len(peer_ids & {h.peer_id for h in hosts}), ignored

    wait_for(lambda: sum(read()) >= len(nodes), 60, "the strangers' records read")
    return read()


def sybils(swarm: Swarm, block: int, keys: int) -> dict:
    """`keys` strangers, each a node under a key (and peer id) of its own, announcing one poisoned
    checkpoint of `block` a save ahead of its honest host and serving it, for download and for
    denoising (so that they agree with each other), beside that host. In an open swarm at the
    peer's defaults an identity costs nothing; `defended_swarm` prices or certifies them."""
    poison, figures = poisoned(swarm, block)
    newest = max(h.announcement.step for h in hosts_of(swarm.client, block))
    store = CheckpointStore(swarm.local.workdir / "sybils", swarm.config, block, swarm.local.swarm)
    info = store.save(poison, newest + swarm.args.save_every)
    with sybil_nodes(swarm.local.swarm, swarm.local.initial_peers, store, info, poison, swarm.config, keys) as nodes:
        counted, ignored = records_read(swarm, block, nodes)
        candidates = rank(hosts_of(swarm.client, block), swarm.config)
        vouchers = {c.checkpoint.sha256[:12]: independent(c.hosts) for c in candidates}
        row = measured(swarm, "sybils", block, liar_sha256s={info.sha256}, liar_peer=nodes[0].peer_id, generate=True)
    directory = swarm.client.directory
    return {"block": block, "sybil_keys": keys, "sybil_records_counted": counted, "records_ignored": ignored,
            "liar_step": info.step, "poison_sha256": info.sha256[:12], "vouchers_by_checkpoint": vouchers,
            "members_only": directory.membership.members_only,
            "identity_work_bits": directory.work.terms.bits if directory.work.terms else 0,
            **figures, **row}  # fmt: skip


DEFENCES = {"members_only": ["--members-only"], "identity_work": ["--identity-work", str(SYBIL_WORK_BITS)]}


@contextlib.contextmanager
def defended_swarm(swarm: Swarm, defence: str) -> Iterator[Swarm]:
    """A swarm of part 1's model created with `defence` (`DEFENCES`), each block hosted by one honest
    swarm-peer (a member where the swarm is members-only) serving part 1's honest checkpoint of it,
    copied (it trains no further), with a client (a member's) for generation."""
    workdir = swarm.workdir / defence
    with LocalSwarm(workdir, swarm=swarm.local.swarm, config_path=str(write_config(workdir))) as local:
        local.start_bootstrap(refresh_period=2, extra=DEFENCES[defence])
        invite = local.invite if defence == "members_only" else (lambda name: [])
        for block in (0, 1):
            info, name = swarm.honest_checkpoint(block), f"honest{block}"
            (local.workdir / name).mkdir(parents=True)
            (local.workdir / name / f"block_{block}_step_{info.step}.safetensors").write_bytes(swarm.honest_file(info))
            local.start_peer(name, str(block), ["--max-steps", str(info.step), *invite(name)])
        credentials = None
        if defence == "members_only":
            invite("client")
            credentials = local.credentials("client")
        with local.client(credentials=credentials) as client:
            client.directory.wait_for_model(60)  # learns the creator's terms: members only, or the work asked
            wait_for(lambda: all(len(hosts_of(client, b)) == 1 for b in (0, 1)), 180, "the honest hosts", interval=2.0)
            yield dataclasses.replace(swarm, workdir=workdir, local=local, client=client, invite=invite)


def defended_sybils(swarm: Swarm, defence: str) -> dict:
    """The Sybil row in a swarm created with `defence`: the Sybils hold no certificate, or did no work."""
    with defended_swarm(swarm, defence) as defended:
        return {"defence": DEFENCES[defence], **sybils(defended, 0, swarm.args.sybils)}


def checkpoint_ahead(swarm: Swarm, name: str, block: int, denoiser: Denoiser, ahead: int, answers=False,
                     serves: bool = False, step: int | None = None) -> dict:  # fmt: skip
    """One key serving `denoiser` stamped `ahead` steps past the honest checkpoint of `block` (or at
    `step`), for download and, with `answers`, for denoise requests, which it answers wrongly, or,
    with `serves`, with `denoiser` itself."""
    step = swarm.honest_checkpoint(block).step + ahead if step is None else step
    store = CheckpointStore(swarm.local.workdir / name, swarm.config, block, swarm.local.swarm)
    info = store.save(denoiser, step)
    with swarm.stranger(block) as node:
        node.serve_checkpoint(store, info, *stranger_answers(swarm.config, block, info, denoiser, answers, serves))
        swarm.wait_for_record(block, node.peer_id)
        row = measured(swarm, name, block, liar_sha256s={info.sha256}, liar_peer=node.peer_id,
                       generate=answers or serves)  # fmt: skip
    return {"block": block, "liar_step": step, **row}


def stranger_answers(config: ModelConfig, block: int, info: CheckpointInfo, denoiser: Denoiser, wrong: bool,
                     serves: bool) -> list:  # fmt: skip
    """What a stranger's denoise service answers with: wrongly, with its own weights, or none."""
    if wrong:
        return [WrongAnswers(config, block, info.sha256)]
    if serves:
        service = DenoiseServicer(config, block)
        service.swap_in(denoiser, info.sha256)
        return [service]
    return []


def tuned_block(swarm: Swarm, block: int, worse_by: float) -> tuple[Denoiser, dict]:
    """Issue 46's stranger against a check it cannot read: the clean fetch's `block` made `worse_by`
    nats per unit worse on held-out text (`degraded_block`), then tuned on the windows and draws of
    a spot check with public seeds (`tuned_to`: what the old check measured, 32 windows of each
    split) until that check scores it better than the honest block. Figures: both blocks on the
    held-out windows and on the public check."""
    config, corpus = swarm.config, load_corpus(None)
    held_out = SpotCheck.from_corpus(corpus, config, count=64, seed=HELD_OUT_SEED)
    public = SpotCheck.from_corpus(corpus, config, count=32, seed=PUBLIC_SEED)
    honest = swarm.reference.denoiser_for_block(block)
    worse = degraded_block(honest, lambda denoiser: held_out.measure(denoiser, config, block), worse_by)
    tuned = tuned_to(worse, public, config, block, beat=public.measure(honest, config, block) - 0.05)
    figures = {"held_out_ce": {"honest": held_out.measure(honest, config, block),
                               "tuned": held_out.measure(tuned, config, block)},
               "public_check_ce": {"honest": public.measure(honest, config, block),
                                   "tuned": public.measure(tuned, config, block)}}  # fmt: skip
    return tuned, figures


def spot_check_tuned(swarm: Swarm, worse_by: float) -> dict:
    """A tuned block (`tuned_block`) of block 1 one save ahead of its hosts, served under one key for
    download and denoising."""
    poison, figures = tuned_block(swarm, 1, worse_by)
    row = checkpoint_ahead(swarm, f"tuned-{worse_by}", 1, poison, swarm.args.save_every, serves=True)
    return {"worse_by": worse_by, **figures, **row}


def step_inflation(swarm: Swarm, block: int = 1) -> dict:
    """The honest weights of `block`, bit for bit, stamped 2 x step + 100 and served under one key
    (for download and denoising): met only if the joiner starts at the honest step."""
    honest = swarm.honest_checkpoint(block)
    weights = swarm.reference.denoiser_for_block(block)
    row = checkpoint_ahead(swarm, "inflation", block, weights, 0, serves=True, step=2 * honest.step + 100)
    row["joiner_step_honest"] = row["joiner"]["step"] == honest.step
    return {"honest_step": honest.step, **row}


def slightly_worse(swarm: Swarm) -> dict:
    """A copy of every block `SLIGHTLY_WORSE` nats per unit worse on held-out text (within the
    spot check's tolerance), one save ahead, each under a key of its own, served for download and
    denoising (issue 46: stamps that win on rank each time cost 3-4% overall)."""
    config = swarm.config
    held_out = SpotCheck.from_corpus(load_corpus(None), config, count=64, seed=HELD_OUT_SEED)
    liars = set()
    with contextlib.ExitStack() as stack:
        for block in range(config.n_blocks):
            honest = swarm.reference.denoiser_for_block(block)
            poison = degraded_block(honest, lambda d, b=block: held_out.measure(d, config, b), SLIGHTLY_WORSE)
            store = CheckpointStore(swarm.local.workdir / f"slightly-worse-{block}", config, block, swarm.local.swarm)
            info = store.save(poison, swarm.honest_checkpoint(block).step + swarm.args.save_every)
            liars.add(info.sha256)
            node = stack.enter_context(swarm.stranger(block))
            node.serve_checkpoint(store, info, *stranger_answers(config, block, info, poison, False, True))
            swarm.wait_for_record(block, node.peer_id)
        row = measured(swarm, "slightly-worse", block, liar_sha256s=liars, liar_peer=node.peer_id, generate=True)
    return {"worse_by": SLIGHTLY_WORSE, **row}


def laundered(swarm: Swarm, block: int = 1) -> dict:
    """Laundering (issue 46): a poisoned block (`poisoned`) one save ahead of the honest checkpoint of
    `block`, served for download and denoising under one key, and bit for bit under a second key whose
    record names the first as the one voice it took it from (`taken_from`), as an honest joiner that
    adopted it from that key alone announces. The poison is step_lie_poisoned_block's, on the same block,
    so that the two rows differ by the launderer alone. Figures: the keys and the independent vouchers
    (`Candidate.vouchers`) the client counts for it: one voice, not two. In this open swarm vouchers only
    order what is measured (every candidate is), so those counts are where laundering would show."""
    poison, figures = poisoned(swarm, block)
    store = CheckpointStore(swarm.local.workdir / "laundered", swarm.config, block, swarm.local.swarm)
    info = store.save(poison, swarm.honest_checkpoint(block).step + swarm.args.save_every)
    with swarm.stranger(block) as source, swarm.stranger(block) as launderer:
        for node, taken_from in ((source, ()), (launderer, (source.directory.fingerprint,))):
            answers = stranger_answers(swarm.config, block, info, poison, False, True)
            node.serve_checkpoint(store, info, *answers, taken_from=taken_from)
            swarm.wait_for_record(block, node.peer_id)
        candidates = rank(hosts_of(swarm.client, block), swarm.config)
        poisoned_one = next((c for c in candidates if c.checkpoint.sha256 == info.sha256), None)
        counted = {"keys": independent(poisoned_one.hosts) if poisoned_one else 0,
                   "vouchers": poisoned_one.vouchers if poisoned_one else None}  # None: the record went unread
        row = measured(swarm, "laundered", block, liar_sha256s={info.sha256}, liar_peer=launderer.peer_id,
                       generate=True)  # fmt: skip
    return {"block": block, "liar_step": info.step, "poison_sha256": info.sha256[:12],
            "laundered_checkpoint_counted": counted, **figures, **row}  # fmt: skip


def flood(swarm: Swarm, block: int = 0) -> dict:
    """A flood of free keys (issue 46): `MEASURED_AT_MOST` + `FLOOD_BEYOND_BOUND` keys, each announcing and
    serving (for download and denoising, at full speed) a checkpoint of its own one save ahead of the honest
    checkpoint of `block`: distinct copies (`distinct_copies`) of a poisoned block (`poisoned`). Ranked by
    step, the honest checkpoint comes after all of them, past what a choice measures, unless the ledger
    credits its host's key (`backed_keys`), which `rank` puts first. Figures: the flood's keys and how many
    of their records the client reads; whether the honest host is backed, read just before the fetch, and
    the honest checkpoint's place in the order of measurement (0 first; measured only below
    `MEASURED_AT_MOST`); the fetch's seconds are in its own figures."""
    keys, honest = MEASURED_AT_MOST + FLOOD_BEYOND_BOUND, swarm.honest_checkpoint(block)
    poison, figures = poisoned(swarm, block)
    served = []
    for index, weights in enumerate(distinct_copies(poison, keys)):
        store = CheckpointStore(swarm.local.workdir / f"flood-{index}", swarm.config, block, swarm.local.swarm)
        served.append((store, store.save(weights, honest.step + swarm.args.save_every), weights))
    with serving_nodes(swarm.local.swarm, swarm.local.initial_peers, served, swarm.config) as nodes:
        counted, ignored = records_read(swarm, block, nodes)
        order = rank(hosts_of(swarm.client, block), swarm.config, backed_keys(swarm.client.directory))
        place = next((i for i, c in enumerate(order) if c.checkpoint.sha256 == honest.sha256), None)  # None: unread
        flooded = {info.sha256 for _, info, _ in served}
        row = measured(swarm, "flood", block, liar_sha256s=flooded, liar_peer=nodes[0].peer_id, generate=True)
    backed = None if place is None else order[place].backed
    return {"block": block, "flood_keys": keys, "flood_records_read": counted, "records_ignored": ignored,
            "liar_step": honest.step + swarm.args.save_every, "honest_host_backed": backed,
            "honest_measurement_place": place, "measured_at_most": MEASURED_AT_MOST, **figures, **row}  # fmt: skip


def oversized(swarm: Swarm) -> dict:
    honest = swarm.honest_checkpoint(1)
    with swarm.stranger(1) as node:
        node.serve(InfoServicer(lambda: node.info(1)), TricklingDownloads(1))
        huge = CheckpointInfo(step=honest.step + 1, sha256="ab" * 32, size=2**33, chunks="ab" * 32)
        node.announce(1, **checkpoint_of(huge))
        return measured(swarm, "oversized", 1, joiner=False)


def hijack(swarm: Swarm) -> dict:
    config = swarm.config
    other = ModelConfig(**{**config.to_dict(), "n_blocks": 1, "n_layers": 2})
    with HostileNode(swarm.local.swarm, swarm.local.initial_peers) as node:  # it announces no block
        node.directory.publish_model(other, lifetime_s=600)
        status = swarm.local.run("swarm-status", "--json")
        followed = json.loads(status.stdout)["config_hash"] if status.returncode == 0 else None
        return {"status_follows_creator": followed == config.hash(), **measured(swarm, "hijack", 1, joiner=False)}


def wrong_answers(swarm: Swarm) -> dict:
    honest = swarm.honest_checkpoint(1)
    with swarm.stranger(1) as node:
        empty = CheckpointStore(swarm.local.workdir / "wrong-answers", swarm.config, 1, swarm.local.swarm)  # no file
        liar = WrongAnswers(swarm.config, 1, honest.sha256)
        node.serve(InfoServicer(lambda: node.info(1)), BlockServicer(1, empty), liar)  # downloads refused
        node.announce(1, state="serving", **checkpoint_of(honest))
        swarm.wait_for_record(1, node.peer_id)
        return measured(swarm, "wrong-answers", 1, joiner=False, liar_peer=node.peer_id, generate=True)


def honest_then_lying(swarm: Swarm, block: int) -> dict:
    """A key vouching for the honest checkpoint of `block` that answers its first request with
    the true weights (the one a check-the-first-answer policy checks), then with others."""
    honest = swarm.honest_checkpoint(block)
    with swarm.stranger(block) as node:
        liar = HonestThenWrong(swarm.config, block, swarm.reference.denoiser_for_block(block), honest.sha256, honest=1)
        node.serve(InfoServicer(lambda: node.info(block)), liar)
        node.announce(block, state="serving", **checkpoint_of(honest))
        swarm.wait_for_record(block, node.peer_id)
        row = measured(swarm, f"honest-then-lying-{block}", block, joiner=False, liar_peer=node.peer_id, generate=True)
    return {"block": block, **row, "liar_answers": liar.answered, "liar_lied": liar.answered > liar.honest}


def free_keys_outvote(swarm: Swarm, block: int = 0) -> dict:
    """Issue 57, outvoting a lone host: for each k of `FREE_KEYS`, k free keys (each a node of its own)
    announce the checkpoint of `block`'s lone honest host (b0), serve its true file for download, and
    answer every denoise request with one set of wrong weights, all alike, so that they agree with each
    other and outnumber b0; the client prefers them (the fastest). Counted as keys they were a strict
    majority: b0 banned, their answers used and credited. Generation at each k (`generation_by_keys`), a
    fetch with the most keys up; met where every generation equals clean local generation, no hostile key
    is credited and no honest key less than in the clean row (`credit_met`)."""
    honest = swarm.honest_checkpoint(block)
    store = CheckpointStore(swarm.local.workdir / "outvote", swarm.config, block, swarm.local.swarm)
    store.adopt(swarm.honest_file(honest), honest)
    wrong = garbage_block(swarm.config, block, scale=1.0)  # one set of weights for all: their answers agree
    by_keys, row = {}, {}
    for keys in FREE_KEYS:
        liars_up = sybil_nodes(swarm.local.swarm, swarm.local.initial_peers, store, honest, wrong, swarm.config, keys)
        with liars_up as nodes:
            records_read(swarm, block, nodes)
            liars = [node.peer_id for node in nodes]
            if keys == max(FREE_KEYS):
                row = measured(swarm, "outvote", block, joiner=False, liar_peer=liars, generate=True)
                by_keys[str(keys)] = row["generation"]
            else:
                by_keys[str(keys)] = generation(swarm, liars)
    return {"block": block, "free_keys": list(FREE_KEYS), **row, "generation_by_keys": by_keys}


def chunk_list_stall(swarm: Swarm, block: int = 0) -> dict:
    """Issue 57's stalled chunk list, for each k of `FREE_KEYS`: k - 1 free keys announce the checkpoint
    of `block`'s lone honest host (b0) under keys of their own and answer every chunk list and download
    "busy" just before the timeout (`stalling_node`), and one more serves a poisoned `block` (`poisoned`)
    one save ahead at full speed, for download and denoising. A download that waited for every host's
    list was held until the poison was in, then dropped as slow, and the poison, measured alone, was
    fetched, joined and used. At each k (`by_keys`): a fetch, which checkpoint it took (`fetch_took`:
    "honest", "poison" or "other"), a joiner, generation preferring the poisoner, and the stallers' chunk
    lists asked and answered. The row's own fetch, joiner and generation are those of the most keys."""
    honest, (poison, figures) = swarm.honest_checkpoint(block), poisoned(swarm, block)
    store = CheckpointStore(swarm.local.workdir / "stall-poison", swarm.config, block, swarm.local.swarm)
    ahead = store.save(poison, honest.step + swarm.args.save_every)
    names = {honest.sha256[:12]: "honest", ahead.sha256[:12]: "poison"}
    by_keys = {}
    for keys in FREE_KEYS:
        with contextlib.ExitStack() as stack:
            stallers = [stalling_node(swarm, stack, block, honest) for _ in range(keys - 1)]
            poisoner = stack.enter_context(swarm.stranger(block))
            poisoner.serve_checkpoint(store, ahead, *stranger_answers(swarm.config, block, ahead, poison, False, True))
            swarm.wait_for_record(block, poisoner.peer_id)
            row = measured(swarm, f"stall-{keys}", block, liar_sha256s={ahead.sha256}, liar_peer=poisoner.peer_id,
                           generate=True)  # fmt: skip
        fetched = row["fetch"]
        row["fetch_took"] = names.get(fetched["sha256"][block], "other") if fetched["fetched"] else None
        row["stallers_chunk_lists"] = {"asked": sum(s.asked["chunk_list"] for s in stallers),
                                       "answered": sum(s.answered["chunk_list"] for s in stallers)}  # fmt: skip
        by_keys[str(keys)] = row
    most = {key: by_keys[str(max(FREE_KEYS))][key] for key in ("fetch", "joiner", "generation", "fetch_took")}
    return {"block": block, "free_keys": list(FREE_KEYS), "stallers": [k - 1 for k in FREE_KEYS],
            "liar_step": ahead.step, "poison_sha256": ahead.sha256[:12], **figures, **most,
            "by_keys": by_keys}  # fmt: skip


def stalling_node(swarm: Swarm, stack: contextlib.ExitStack, block: int, info: CheckpointInfo) -> BusyJustInTime:
    """A free key (a stranger's node, left when `stack` closes) announcing checkpoint `info` of `block` and
    answering every chunk list and download busy just before the timeout (`BusyJustInTime`): its servicer."""
    node = stack.enter_context(swarm.stranger(block))
    staller = BusyJustInTime(block)
    node.serve(InfoServicer(lambda: node.info(block)), staller)
    node.announce(block, state="serving", **checkpoint_of(info))
    swarm.wait_for_record(block, node.peer_id)
    return staller


def part_one_rows(swarm: Swarm) -> dict[str, Callable[[], dict]]:
    config, save = swarm.config, swarm.args.save_every
    return {
        "step_lie_garbage_block": lambda: step_lie(swarm, "garbage-liar", poison=False),
        "step_lie_poisoned_block": lambda: step_lie(swarm, "poisoned-liar", poison=True),
        "sybil_keys_vouching_poisoned_block": lambda: sybils(swarm, 0, swarm.args.sybils),
        "sybil_keys_in_members_only_swarm": lambda: defended_sybils(swarm, "members_only"),
        "sybil_keys_in_identity_work_swarm": lambda: defended_sybils(swarm, "identity_work"),
        "nan_weight_block": lambda: checkpoint_ahead(swarm, "nan-weight", 0, nan_weight_block(config, 0), save),
        "nan_loss_block": lambda: checkpoint_ahead(swarm, "nan-loss", 0, overflowing_block(config, 0), save),
        "one_record_ahead": lambda: checkpoint_ahead(swarm, "one-ahead", 0, garbage_block(config, 0), 1, answers=True),
        "oversized_announcement": lambda: oversized(swarm),
        "model_record_hijack": lambda: hijack(swarm),
        "wrong_denoise_answers": lambda: wrong_answers(swarm),
        "honest_then_lying_beside_two_keys": lambda: honest_then_lying(swarm, 1),
        "honest_then_lying_beside_one_key": lambda: honest_then_lying(swarm, 0),
        "free_keys_outvote_lone_host": lambda: free_keys_outvote(swarm),
        "chunk_list_stall_beside_fast_poison": lambda: chunk_list_stall(swarm),
        **{f"spot_check_tuned_{worse_by}": functools.partial(spot_check_tuned, swarm, worse_by)
           for worse_by in TUNED_GRADES},
        "step_inflation": lambda: step_inflation(swarm),
        "honest_weights_restamped_lying_answers": lambda: checkpoint_ahead(
            swarm, "restamped-lying", 0, swarm.reference.denoiser_for_block(0), save, answers=True),
        "slightly_worse_every_save": lambda: slightly_worse(swarm),
        "laundered_block": lambda: laundered(swarm),
        "flood_of_distinct_checkpoints": lambda: flood(swarm),
    }


def scored(row: dict, clean: dict) -> dict:
    """The row's quality over the clean fetch's, and whether it met every bound."""
    fetched = row.get("fetch") or {}
    if fetched.get("fetched") and clean.get("fetch", {}).get("fetched"):
        row["bits_per_byte_over_clean"] = fetched["bits_per_byte"] / clean["fetch"]["bits_per_byte"]
    keyed = scored_by_keys(row, clean) if "by_keys" in row else []
    checks = ["error" not in row, (row.get("honest_peers") or {}).get("ok", False),
              row.get("bits_per_byte_over_clean", math.inf) <= QUALITY_BOUND, *keyed]  # fmt: skip
    if "joiner" in row:
        checks.append(not row["joiner"]["from_liar"])
    if "joiner_step_honest" in row:
        checks.append(row["joiner_step_honest"])
    if "laundered_checkpoint_counted" in row:  # the launderer's key is the source's voice, not a second voucher
        checks.append(row["laundered_checkpoint_counted"]["vouchers"] == 1)
    if "honest_measurement_place" in row:  # the flood kept the honest checkpoint inside what a choice measures
        place = row["honest_measurement_place"]
        checks.append(place is not None and place < row["measured_at_most"])
    if "held_out_ce" in row:  # a tuned block no worse where the stranger graded it is no poison: said, still not met
        row["attack_made_no_worse_block"] = row["held_out_ce"]["tuned"] <= row["held_out_ce"]["honest"]
    generated = list(row.get("generation_by_keys", {}).values()) or ([row["generation"]] if "generation" in row else [])
    for one in generated:
        checks += [one["used_only_clean_checkpoints"], one["equals_clean_local_generation"]]
    if "generation_by_keys" in row:  # issue 57: the ledger credits answers checked here, never a liar's
        row["credit_met"] = all(credit_bound(one["credited"], clean["generation"]["credited"]) for one in generated)
        checks.append(row["credit_met"])
    if "status_follows_creator" in row:
        checks.append(row["status_follows_creator"])
    row["met"] = all(checks)
    return row


def scored_by_keys(row: dict, clean: dict) -> list[bool]:
    """The checks of a row run once per count of free keys (`by_keys`): at each count, the fetch within
    `QUALITY_BOUND` of the clean one, the joiner on no liar's checkpoint, generation on the clean
    checkpoints alone and equal to clean local generation. The row's bits per byte over clean is its
    worst count's."""
    checks, ratios = [], []
    for one in row["by_keys"].values():
        fetched = one.get("fetch") or {}
        if fetched.get("fetched") and clean.get("fetch", {}).get("fetched"):
            one["bits_per_byte_over_clean"] = fetched["bits_per_byte"] / clean["fetch"]["bits_per_byte"]
        ratios.append(one.get("bits_per_byte_over_clean", math.inf))
        checks += [not one["joiner"]["from_liar"], one["generation"]["used_only_clean_checkpoints"],
                   one["generation"]["equals_clean_local_generation"]]  # fmt: skip
    row["bits_per_byte_over_clean"] = max(ratios, default=math.inf)
    return checks


def credit_bound(credits: dict, clean: dict) -> bool:
    """No hostile key credited, and no honest key credited less than in the clean row (`credited`)."""
    not_less = all(credits["honest"].get(name, 0) >= count for name, count in clean["honest"].items())
    return credits["hostile"] == 0 and not_less and not credits["honest_banned_for_good"]


def part_one(args, workdir: Path) -> dict:
    config_path, config = write_config(workdir), ModelConfig(**SMALL)
    with LocalSwarm(workdir, swarm="attacks", config_path=str(config_path)) as local:
        local.start_bootstrap(refresh_period=2)
        with local.client() as client:
            honest = trained_swarm(args, local, client)
            for handle, _ in honest:  # from here on, each row's own peak
                handle.reset_peak_rss()
            swarm = Swarm(args, workdir, local, client, config)
            clean = {"fetch": fetch(local, "clean-fetch", args.windows)}
            swarm.reference = load_model_folder(local.workdir / "clean-fetch")
            clean["generation"] = generation(swarm)
            health = honest_health(client, honest)
            clean["honest_peers"] = beside_clean(health, health)
            results = {"clean": scored(clean, clean)}
            rows = part_one_rows(swarm)
            for name, run in ((n, r) for n, r in rows.items() if not args.rows or n in args.rows):
                for handle, _ in honest:
                    handle.reset_peak_rss()
                row = guarded(name, run)
                row["honest_peers"] = beside_clean(honest_health(client, honest), clean["honest_peers"])
                if not row["honest_peers"]["ok"]:  # a diagnostic, not a second chance: `met` stays with the first
                    time.sleep(RECENT_S)
                    row["honest_peers_later"] = {"after_s": RECENT_S, **honest_health(client, honest)}
                results[name] = scored(row, clean)
            results["honest_peers_crashed"] = sum(h.process.poll() not in (None, 0) for h, _ in honest)
    results["met"] = all(row["met"] for row in results.values() if isinstance(row, dict))
    return results


# ---- parts 2 and 3: training beside a stranger ----------------------------------------------


def stranger_services(args, node: HostileNode, config: ModelConfig, kind: str, value_bits: int, folder: Path,
                      fellows: list[str]) -> list:  # fmt: skip
    """What the stranger of a training run serves: `kind` names it (the module docstring); `fellows`:
    the peer ids of every stranger of the run."""
    if kind == "lying-replies":
        return [LyingSyncReplies(0)]
    if kind == "step-claims":
        return [LyingSyncReplies.step_claims(0)]
    if kind == "jump-claims":
        return [JumpClaims(0)]
    if kind == "refused-payloads":
        return [RefusedPayloads(0)]
    if kind == "empty-payloads":
        return [EmptyPayloads(0, value_bits)]
    windows = load_corpus(None).windows("train", config)
    de_mo = dataclasses.replace(PEER.de_mo, value_bits=value_bits)
    if kind == "merge-poison":
        store = CheckpointStore(folder, config, 0, node.swarm)
        poison = garbage_block(config, 0)
        poisoner = MergePoisoner(node, config, 0, de_mo, PEER.lr, windows, store, poison, args.average_every)
        return [InfoServicer(lambda: node.info(0)), BlockServicer(0, store), poisoner]
    if kind == "negated-echo":
        return [NegatedEcho(node, config, 0, de_mo, PEER.lr, fellows)]
    return [HostileReplica(node, config, 0, de_mo, PEER.lr, kind, windows)]


def train_block(args, workdir: Path, honest: dict[str, list[str]], stranger: str | None,
                value_bits: int = PEER.de_mo.value_bits, keys: int = 1) -> tuple[dict, list[Denoiser]]:  # fmt: skip
    """Block 0 trained by the peers `honest` (name: options), beside `keys` strangers of kind `stranger`
    if given (each under a key of its own); returns the run's figures and the honest replicas' final
    blocks (those that finished)."""
    config = ModelConfig(**SMALL)
    config_path = write_config(workdir)
    with LocalSwarm(workdir, swarm="training", config_path=str(config_path)) as local:
        local.start_bootstrap(refresh_period=2)
        with contextlib.ExitStack() as strangers, local.client() as client:
            nodes = [strangers.enter_context(HostileNode(local.swarm, local.initial_peers))
                     for _ in range(keys if stranger else 0)]  # fmt: skip
            for index, node in enumerate(nodes):
                node.serve(*stranger_services(args, node, config, stranger, value_bits, workdir / f"stranger{index}",
                                              [n.peer_id for n in nodes]))  # fmt: skip
                node.announce(0, lifetime_s=3600)
            started = time.monotonic()
            peers = [(local.start_peer(name, "0", options), 0) for name, options in honest.items()]
            try:
                wait_for(lambda: len(hosts_of(client, 0)) == len(honest), args.timeout, "the honest replicas")
                hung = False
            except WaitTimeout:
                hung = True
            seconds = time.monotonic() - started
            health = honest_health(client, peers)
            finals = {h.announcement.public_name: h.announcement.step for h in hosts_of(client, 0)
                      if h.announcement.public_name in honest}  # fmt: skip
            logs = [handle.log() for handle, _ in peers]
        steps = {name: finals.get(name, args.train_steps) for name in honest}  # its final checkpoint's step
        paths = [local.workdir / name / f"block_0_step_{step}.safetensors" for name, step in steps.items()]
        blocks = [load_block(path, config, 0)[0] for path in paths if path.exists()]
    losses = [block_elbo_bits(b, config, 0, args.windows) for b in blocks]
    figures = {"value_bits": value_bits, "honest_replicas": len(honest), "finished": len(blocks),
               "validation_loss": statistics.mean(losses) if losses else None, "validation_loss_per_replica": losses,
               "final_steps": list(finals.values()), "step_jump": any(s != args.train_steps for s in finals.values()),
               **trained_per_log(logs),
               "largest_weight": max((p.abs().max().item() for b in blocks for p in b.parameters()), default=None),
               **{key: sum(log.count(line) for log in logs) for key, line in LOG_COUNTS.items()},
               "honest_peers": health, "honest_crashed": sum(h.process.poll() not in (None, 0) for h, _ in peers),
               "hung": hung, "seconds": seconds}  # fmt: skip
    return figures, blocks


def trained_per_log(logs: list[str]) -> dict:
    """What the honest replicas' logs say they trained: the steps each trained (None: it did not say), and
    their mean seconds per step, by the log's clock from the first step's start to the last save's end."""
    trained, seconds = [], []
    for log in logs:
        start = re.search(r"^(\S+ \S+) .*: block \d+: training from step", log, re.MULTILINE)
        end = re.search(r"^(\S+ \S+) .*: block \d+: trained (\d+) steps, to step", log, re.MULTILINE)
        trained.append(int(end[2]) if end else None)
        if start and end and int(end[2]):
            clock = [datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() for m in (start, end)]
            seconds.append((clock[1] - clock[0]) / int(end[2]))
    return {"trained_steps": trained, "seconds_per_step": statistics.mean(seconds) if seconds else None}


def trained_as_asked(run: dict) -> bool:
    """Every honest replica finished every step, no more, and is up, announcing, not hung."""
    return (run["finished"] == run["honest_replicas"] and not run["step_jump"] and run["honest_peers"]["ok"]
            and not run["hung"])  # fmt: skip


PART_TWO = {16: ("negated", "max-values", "random-signs", "lying-replies", "refused-payloads", "merge-poison"),
            1: ("negated", "max-values", "random-signs")}  # fmt: skip
HONEST_REPLICAS = (3, 2)  # the layouts of part 2: honest replicas beside the stranger (and in their clean run)


def part_two(args, workdir: Path) -> dict:
    runs = {}
    for bits, attacks in PART_TWO.items():
        for replicas in HONEST_REPLICAS:
            honest = [f"h{r}" for r in range(replicas)]
            clean = None
            for attack in (None, *attacks):
                name = f"{attack or 'clean'}_{replicas}honest_{bits}bit"
                options = peer_options(args, args.train_steps, replicas + bool(attack), bits)
                logger.info("training run: %s", name)
                figures, _ = train_block(args, workdir / name, dict.fromkeys(honest, options), attack, bits)
                runs[name] = run = {"attack": attack or "none", **figures}
                clean = clean or run
                beside_clean(run["honest_peers"], clean["honest_peers"])
                if attack and run["validation_loss"] is not None and clean["validation_loss"]:
                    run["honest_loss_over_clean"] = run["validation_loss"] / clean["validation_loss"]
                bounded = attack is None or run.get("honest_loss_over_clean", math.inf) <= LOSS_BOUND
                run["met"] = trained_as_asked(run) and bounded
    runs["met"] = all(run["met"] for run in runs.values())
    return runs


def distance(a: Denoiser, b: Denoiser) -> float:
    return math.sqrt(sum((p - q).pow(2).sum().item() for p, q in zip(a.parameters(), b.parameters(), strict=True)))


def part_three(args, workdir: Path) -> dict:
    """One honest replica alone, then beside a stranger, with one identity (so the same batches)."""
    config = ModelConfig(**SMALL)
    options = peer_options(args, args.train_steps) + ["--identity", str(workdir / "h0.id")]  # made by the first run
    runs, finals = {}, {}
    for attack in (None, "step-claims", "negated"):
        name = attack or "lone"
        logger.info("two-replica run: %s", name)
        figures, finals[name] = train_block(args, workdir / name, {"h0": options}, attack)
        runs[name] = {"attack": attack or "none (one replica alone)", **figures}
    start = block_trainer(config, 0, load_corpus(None).windows("train", config), TrainConfig()).module
    lone, lone_loss = (finals["lone"] or [None])[0], runs["lone"]["validation_loss"]
    runs["start_loss"] = block_elbo_bits(start, config, 0, args.windows)
    for name in ("lone", "step-claims", "negated"):
        run = runs[name]
        beside_clean(run["honest_peers"], runs["lone"]["honest_peers"])
        if name != "lone" and run["validation_loss"] is not None and lone_loss:
            run["loss_over_lone"] = run["validation_loss"] / lone_loss
            run["weight_distance_over_travel"] = distance(finals[name][0], lone) / distance(lone, start)
        run["met"] = trained_as_asked(run) and (name == "lone" or run.get("loss_over_lone", math.inf) <= LOSS_BOUND)
    runs["met"] = all(runs[name]["met"] for name in ("lone", "step-claims", "negated"))
    for row, kind in FREE_KEY_ROWS.items():
        rows = free_keys_every_step(args, workdir, options, runs["lone"], row, kind)
        runs |= rows
        runs["met"] = runs["met"] and all(run["met"] for run in rows.values())
    return runs


FREE_KEY_ROWS = {"jump_every_step": "jump-claims", "negated_echo_every_step": "negated-echo",
                 "empty_payloads_every_step": "empty-payloads"}  # fmt: skip (part 3's rows of k free keys, by kind)


def free_keys_every_step(args, workdir: Path, options: list[str], lone: dict, row: str, kind: str) -> dict[str, dict]:
    """Issue 57's free keys beside a lone replica (`options`, its identity included): for each k of
    `FREE_KEYS`, k keys of `kind` (module docstring: claiming on every step the step asked plus 1000,
    or sending its payload negated, or nothing). Met when it trains every step, its final step is
    within its jumps' budget (its allowance, a tenth of its schedule at most 1000, plus `JUMP_SHARE`
    of its steps), and its loss and seconds per step beside them are within `ALONE_LOSS_BOUND` and
    `ALONE_SECONDS_BOUND` of the lone run's."""
    schedule = dataclasses.replace(PEER, max_steps=args.train_steps).train_config().steps
    bound = args.train_steps + allowance_for(schedule) + JUMP_SHARE * args.train_steps
    rows = {}
    for keys in FREE_KEYS:
        name = f"{row}_{keys}keys"
        logger.info("two-replica run: %s", name)
        figures, _ = train_block(args, workdir / name, {"h0": options}, kind, keys=keys)
        run = rows[name] = {"attack": f"{kind}, {keys} free keys", "free_keys": keys, **figures,
                            "final_step_bound": bound}  # fmt: skip
        beside_clean(run["honest_peers"], lone["honest_peers"])
        if run["validation_loss"] is not None and lone["validation_loss"]:
            run["loss_over_lone"] = run["validation_loss"] / lone["validation_loss"]
        if run["seconds_per_step"] and lone["seconds_per_step"]:
            run["seconds_per_step_over_lone"] = run["seconds_per_step"] / lone["seconds_per_step"]
        run["met"] = (run["trained_steps"] == [args.train_steps] and all(s <= bound for s in run["final_steps"])
                      and run["finished"] == 1 and run["honest_peers"]["ok"] and not run["hung"]
                      and run.get("loss_over_lone", math.inf) <= ALONE_LOSS_BOUND
                      and run.get("seconds_per_step_over_lone", math.inf) <= ALONE_SECONDS_BOUND)  # fmt: skip
    return rows


# ---- the run ---------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(part, key, bound, title) for part, key, bound, title in (
        ("fetch_and_serve", "bits_per_byte_over_clean", QUALITY_BOUND, "fetched model's bits per byte / clean"),
        ("training", "honest_loss_over_clean", LOSS_BOUND, "honest replicas' loss / clean, same replicas"),
        ("two_replicas", "loss_over_lone", LOSS_BOUND, "honest replica's loss / alone")) if part in result]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (part, key, bound, title) in zip(axes[0], panels, strict=True):
        ratios = {k: v[key] for k, v in result[part].items() if isinstance(v, dict) and v.get(key) is not None}
        ax.barh(list(ratios), list(ratios.values()))
        ax.axvline(bound, color="r", linestyle="--", label=f"{bound}")
        ax.set(title=title, xlim=(0.9, max([1.1, *ratios.values()])))
        ax.legend()
    fig.tight_layout()
    write_picture(path, fig, dpi=110)


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150, help="training steps of the part-1 swarm")
    parser.add_argument("--train-steps", type=int, default=150, help="steps of each part-2 and part-3 training run")
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--average-every", type=int, default=PEER.average_every,
                        help="the peers' merge period (passed on only when it is not their default); the merge "
                             "row's stranger strikes at this step, so it must be below --train-steps")  # fmt: skip
    parser.add_argument("--sybils", type=int, default=20, help="keys vouching for the poisoned block of the Sybil row")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--parts", nargs="+", choices=["1", "2", "3"], default=["1", "2", "3"])
    parser.add_argument("--rows", nargs="+", default=None, help="part 1: only these rows (beside the clean one)")
    parser.add_argument("--out", default="benchmarks/results/attacks")
    args = parser.parse_args()
    if "2" in args.parts and not 0 < args.average_every < args.train_steps:
        parser.error("part 2's merge row needs 0 < --average-every < --train-steps")
    return args


def main() -> None:
    args = arguments()
    setup_logging()
    validation = load_corpus(None).windows("validation", ModelConfig(**SMALL))
    args.windows = validation.fixed(VALIDATION_WINDOWS, seed=EVALUATION_SEED)
    result = {"config": {k: v for k, v in vars(args).items() if k != "windows"},
              "model": ModelConfig(**SMALL).to_dict(),  # its units too (a file without them predates tokens)
              "peer_options": peer_options(args, args.steps), "loss": LOSS}  # fmt: skip
    parts = {"1": ("fetch_and_serve", part_one), "2": ("training", part_two), "3": ("two_replicas", part_three)}
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            key, run = parts[part]
            result[key] = run(args, Path(tmp) / key)
    result["met"] = all(result[key]["met"] for key, _ in parts.values() if key in result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "attacks.json", json.dumps(result, indent=2).encode())
    plot(result, out / "attacks.png")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
