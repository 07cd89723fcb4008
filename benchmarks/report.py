"""Write benchmarks/README.md from benchmarks/results/**, so that no figure on it is typed by hand.

    python benchmarks/report.py           # rewrite the page (a temp file, then a rename)
    python benchmarks/report.py --check   # exit 1, with one line on stderr, if the page is stale

It runs nothing: it reads the JSON files the benchmarks wrote. Each results folder has one
renderer in page/ (beside this file; SECTIONS in page/assembly.py says which); a folder without
one, a JSON file no renderer reads, or a key a renderer needs and does not find is one line on
stderr and exit status 1, never a traceback, because a page written from half a results file
would quote figures nobody measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from page.assembly import render
from page.reading import ReportError

from swarm.files import write_atomic

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAGE = HERE / "README.md"


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
    write_atomic(PAGE, page.encode())  # a reader never sees half a page
    return 0


if __name__ == "__main__":
    sys.exit(main())
