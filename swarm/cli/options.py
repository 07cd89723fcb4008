"""Command-line options shared by every program that joins a swarm."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import click

from swarm.errors import SwarmError
from swarm.model.generate import STEPS_PER_BLOCK
from swarm.model.steps import REVEAL_ORDERS, Sampling
from swarm.p2p.bootstrap import JOIN_VARIABLES
from swarm.p2p.client import SwarmClient
from swarm.p2p.members import Credentials, load_credentials
from swarm.p2p.network import DHT_CALL_TIMEOUT_S, NetworkOptions


def swarm_options(command: Callable) -> Callable:
    """--swarm, --creator, the DHT addresses and the NAT options, as in `swarm-peer --help`.

    The line `swarm-bootstrap` prints (`--swarm S --creator F --initial-peers A ...`) is a
    valid set of these options for every command; so are the environment variables of
    JOIN_VARIABLES (the bootstrap logs them as `export` lines), which an option given overrides."""
    variables = JOIN_VARIABLES
    options = [
        click.option("--swarm", default="demo", show_default=True, envvar=variables["swarm"], show_envvar=True,
                     help="Swarm name (no dots)."),
        click.option("--creator", default=None, callback=_check_fingerprint, envvar=variables["creator"],
                     show_envvar=True, help="Fingerprint of the swarm creator's key (from swarm-bootstrap's line): the "
                     "only model record believed."),
        click.option("--initial-peers", multiple=True, envvar=variables["initial_peers"], show_envvar=True,
                     help="Multiaddr of a peer already in the swarm (repeatable; after the option, several may follow "
                     "it; in the environment variable, separated by spaces)."),
        click.option("--host-maddrs", multiple=True, default=["/ip4/127.0.0.1/tcp/0"], show_default=True,
                     help="Where to listen, e.g. /ip4/0.0.0.0/tcp/31337 for a public peer."),
        click.option("--announce-maddrs", multiple=True, help="Public addresses to tell others (with a fixed port)."),
        click.option("--identity", default=None, help="libp2p identity file: a stable peer id across restarts."),
        click.option("--client-mode", is_flag=True, help="Behind NAT without an open port: ask, do not serve the DHT."),
        click.option("--use-relay/--no-relay", default=True, show_default=True, help="libp2p circuit relays."),
        click.option("--use-auto-relay", is_flag=True, help="Find relays to be reachable from behind NAT."),
        click.option("--dht-timeout", type=click.FloatRange(min=0.5), default=DHT_CALL_TIMEOUT_S, hidden=True,
                     help="Seconds one DHT call may take (tests)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def member_options(command: Callable) -> Callable:
    """--member-key and --certificate: who this process is in a members-only swarm (the key its
    records are signed with, and the creator's certificate for it: swarm-bootstrap invite)."""
    options = [
        click.option("--member-key", default=None,
                     help="Members-only swarms: your member key file (swarm-bootstrap keygen made it)."),
        click.option("--certificate", default=None,
                     help="Members-only swarms: the certificate the swarm's creator gave you for that key."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def member_credentials(kwargs: dict) -> Credentials | None:
    """Take the member options out of a command's keyword arguments, and load what they name."""
    key, certificate = kwargs.pop("member_key", None), kwargs.pop("certificate", None)
    if (key is None) != (certificate is None):
        raise SwarmError("--member-key and --certificate go together: the key, and the certificate that names it")
    return load_credentials(key, certificate) if key is not None else None


def network_options(kwargs: dict) -> NetworkOptions:
    """Take the network options out of a command's keyword arguments."""
    return NetworkOptions(
        initial_peers=list(kwargs.pop("initial_peers")),
        host_maddrs=list(kwargs.pop("host_maddrs")),
        announce_maddrs=list(kwargs.pop("announce_maddrs")),
        identity_path=kwargs.pop("identity"),
        client_mode=kwargs.pop("client_mode"),
        use_relay=kwargs.pop("use_relay"),
        use_auto_relay=kwargs.pop("use_auto_relay"),
        dht_timeout=kwargs.pop("dht_timeout"),
    )


def _check_fingerprint(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[0-9a-f]{32}", value):
        raise click.BadParameter("must be the 32 hex digits swarm-bootstrap printed")
    return value


def checked_text_source(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """A --data (or --text) file or folder with no text to read is one line of ours now, before anything
    starts: the datasets library would say only "An error occurred while generating the dataset", and a
    peer would say it after joining. A name that is not a path (the built-in corpus, a dataset) passes."""
    if value is None or not Path(value).exists():
        return value
    path = Path(value)
    files = [path] if not path.is_dir() else sorted(p for p in path.rglob("*") if p.is_file())
    if not any(_first_byte(file) for file in files):
        what = "is empty" if not path.is_dir() else "holds no text (no file, or only empty files)"
        raise SwarmError(f"{parameter.opts[0]} {value} {what}: there is no text to read")
    return value


def _first_byte(file: Path) -> bytes:
    """The file's first byte (b"" if it is empty); SwarmError if it cannot be read."""
    try:
        with file.open("rb") as handle:
            return handle.read(1)
    except OSError as error:
        raise SwarmError(f"cannot read {file}: {error.strerror or error}") from None


def swarm_client(kwargs: dict) -> SwarmClient:
    """A client of the swarm the options name; SwarmError if they name no peer to join through."""
    swarm, creator, network = kwargs.pop("swarm"), kwargs.pop("creator"), network_options(kwargs)
    credentials = member_credentials(kwargs)
    if not network.initial_peers:
        raise SwarmError(f"--initial-peers is required (or {JOIN_VARIABLES['initial_peers']}): the address printed "
                         "by swarm-bootstrap")
    return SwarmClient(swarm, network, creator, credentials)


steps_per_block_option = click.option(
    "--steps-per-block",
    type=click.IntRange(min=1),
    default=STEPS_PER_BLOCK,
    show_default=True,
    help="Denoising steps of each block per span it writes (more: slower, and often better text).",
)

reveal_option = click.option(
    "--reveal",
    type=click.Choice(REVEAL_ORDERS),
    default=Sampling.reveal,
    show_default=True,
    help="Which hidden units each masked step shows: the earliest (writing left to right), those the block is "
    "surest of, or a random draw.",
)
