"""Identity cost: what the scrypt work of an open swarm (swarm/p2p/work.py) costs an honest joiner,
an attacker who wants many identities, and every reader who checks a record.

Measured on one core (CPU seconds of this process, `time.process_time`), with the library's own
functions and the default scrypt cost of `IdentityWork` (n = 2^14, r = 8: 16 MiB a try):
- one try: the seconds of CPU per scrypt evaluation, over `--tries` tries;
- the expected seconds of one core to solve at each of `--bits` (2^bits tries on average, at the
  measured rate), and `--solves` actual solves at `--small-bits` to check the model (tries found
  against 2^small-bits expected: a geometric draw, so a few solves are noisy);
- a reader's side: the CPU a directory spends on one new record (one try), on a record already
  judged (a look-up), and on one read that meets a flood of `--flood` new records with bad nonces
  (bounded by `work.MAX_CHECKS_PER_READ`);
- at the recommended price (`work.RECOMMENDED_BITS`): one honest joiner's expected cost (paid once
  per key and peer id) beside `--sybils` identities' for an attacker.

    python benchmarks/identity_cost.py            # about 20 seconds on one core
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from swarm.files import write_atomic
from swarm.p2p import work
from swarm.p2p.records import IdentityWork, owner_fingerprint

SWARM = "identitycost"
KEY = b"[owner:ssh-rsa AAAAbenchmarkkey]"


def cpu_seconds(function, *args) -> tuple[float, object]:
    began = time.process_time()
    result = function(*args)
    return time.process_time() - began, result


def seconds_per_try(terms: IdentityWork, tries: int) -> float:
    fingerprint = owner_fingerprint(KEY)
    seconds, _ = cpu_seconds(
        lambda: [work.work_digest(terms, SWARM, fingerprint, "12D3KooWtry", n) for n in range(tries)])
    return seconds / tries


def small_solves(terms: IdentityWork, solves: int) -> list[dict]:
    """Actual solves, each for a peer id of its own: tries it took and CPU seconds."""
    rows = []
    for i in range(solves):
        seconds, nonce = cpu_seconds(work.solve, terms, SWARM, owner_fingerprint(KEY), f"12D3KooWsolve{i}", None, False)
        rows.append({"tries": nonce + 1, "core_seconds": seconds})
    return rows


def reader_costs(terms: IdentityWork, records: int, flood: int) -> dict:
    """CPU seconds of a directory's check: a new record, a judged one, one read amid a flood."""
    check = work.WorkCheck(SWARM)
    check.terms = terms
    claims = [(KEY, f"12D3KooWrecord{i}", i) for i in range(records)]
    new, _ = cpu_seconds(lambda: [check.refusals([claim]) for claim in claims])
    judged, _ = cpu_seconds(lambda: [check.refusals([claim]) for claim in claims])
    flooded = [(KEY, f"12D3KooWsybil{i}", i) for i in range(flood)]
    flood_s, refusals = cpu_seconds(check.refusals, flooded)
    return {
        "new_record_seconds": new / records,
        "judged_record_seconds": judged / records,
        "flood_records": flood,
        "flood_read_seconds": flood_s,
        "flood_records_checked": flood - refusals.count(work.NOT_CHECKED_YET),
    }


def measure(args: argparse.Namespace) -> dict:
    terms = IdentityWork(bits=args.small_bits)
    per_try = seconds_per_try(terms, args.tries)
    solves = small_solves(terms, args.solves)
    expected = [{"bits": bits, "expected_tries": 2**bits, "core_seconds": per_try * 2**bits} for bits in args.bits]
    honest = per_try * 2**work.RECOMMENDED_BITS
    config = {**vars(args), "log2_n": terms.log2_n, "r": terms.r, "recommended_bits": work.RECOMMENDED_BITS}
    return {
        "config": {**config, "max_checks_per_read": work.MAX_CHECKS_PER_READ},
        "memory_per_try_bytes": 128 * terms.r * 2**terms.log2_n,
        "seconds_per_try": per_try,
        "tries_per_second": 1 / per_try,
        "expected": expected,
        "small_solves": solves,
        "small_solve_mean_tries": statistics.mean(s["tries"] for s in solves),
        "small_solve_expected_tries": 2**args.small_bits,
        "reader": reader_costs(terms, args.records, args.flood),
        "at_recommended": {
            "bits": work.RECOMMENDED_BITS,
            "honest_joiner_core_seconds": honest,
            "sybils": args.sybils,
            "attacker_core_seconds": honest * args.sybils,
            "attacker_core_hours": honest * args.sybils / 3600,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=40, help="scrypt tries timed for the rate")
    parser.add_argument("--bits", type=int, nargs="+", default=[8, 12, 16, 20], help="prices to cost")
    parser.add_argument("--small-bits", type=int, default=6, help="the price of the actual solves")
    parser.add_argument("--solves", type=int, default=4, help="actual solves at --small-bits")
    parser.add_argument("--records", type=int, default=20, help="new records a reader checks, for the mean")
    parser.add_argument("--flood", type=int, default=200, help="new records with bad nonces in one read")
    parser.add_argument("--sybils", type=int, default=20, help="identities the attacker wants")
    parser.add_argument("--out", default="benchmarks/results/identity_cost")
    args = parser.parse_args()
    result = measure(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "identity_cost.json", (json.dumps(result, indent=2) + "\n").encode())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
