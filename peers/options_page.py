"""Write docs/peer-options.md, the reference of swarm-peer's options, from the command itself.

    python -m peers.options_page           # rewrite the page
    python -m peers.options_page --check   # exit 1, in one line, if the page is stale

tests/test_peer_options.py fails when the page is stale, as tests/test_docs.py does for the
benchmarks page.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swarm.cli.config_options import options_page
from swarm.files import write_atomic

from .main import ENVVAR_PREFIX, peer_command

PAGE = Path(__file__).resolve().parent.parent / "docs" / "peer-options.md"
INTRO = (
    "Every option of `swarm-peer`, as `swarm-peer --help` shows it. Written by `python -m peers.options_page` "
    "from the command's own options, which are made from the fields of `PeerConfig` (swarm/peer/config.py), "
    "`DeMoConfig` and `OuterConfig` (swarm/sync/): a default, a bound or a help line is written once, there. "
    f"Each option may instead come from its environment variable (`{ENVVAR_PREFIX}_` and the option's name); an "
    "option given on the command line wins. Exit codes and the conventions every command follows: "
    "[exit-codes.md](exit-codes.md)."
)


def render() -> str:
    """The page as the options are now."""
    return options_page(peer_command, "swarm-peer's options", INTRO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is not what would be written")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            sys.stderr.write(f"{PAGE.name} is stale: run python -m peers.options_page\n")
            return 1
        return 0
    write_atomic(PAGE, page.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
