"""swarm-bootstrap: a long-running DHT entry point, the creator of a new swarm, and its members' certificates.

Option parsing only: the node itself is `swarm.p2p.bootstrap.run_bootstrap`, certificates are
`swarm.p2p.members`. `swarm-bootstrap [options]` runs the node (so `--help` shows its options;
`swarm-bootstrap run [options]`, hidden, still does); `invite`, `revoke` and `keygen` manage the
members of an invite-only swarm.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
from click.core import ParameterSource

from swarm.cli.console import Group, run_command
from swarm.cli.options import network_options, swarm_options
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p import members
from swarm.p2p.bootstrap import JOIN_VARIABLES, BootstrapConfig, run_bootstrap
from swarm.p2p.network import load_key
from swarm.p2p.records import MAX_WORK_BITS, IdentityWork
from swarm.p2p.work import RECOMMENDED_BITS

DEFAULT_IDENTITY = "bootstrap.id"  # a stable peer id (and so stable addresses) across restarts
DEFAULT_VALID_DAYS = 90.0
T = TypeVar("T")


def node_options(command: Callable) -> Callable:
    """The bootstrap node's options: `swarm-bootstrap`'s own (so its --help shows them), and the
    hidden `run` command's, which older command lines name."""
    options = [
        swarm_options,
        click.option("--new-swarm", is_flag=True,
                     help="Create the swarm: publish its model config as <swarm>.model, signed."),
        click.option("--config", "config_path", default=None,
                     help="Model config JSON for --new-swarm (default: built-in)."),
        click.option("--creator-key", default=BootstrapConfig.creator_key, show_default=True,
                     help="With --new-swarm: the RSA key that signs the model record (created on first use); keep it "
                     "to stay the swarm's creator across restarts."),
        click.option("--refresh-period", type=click.FloatRange(min=1), default=BootstrapConfig.refresh_period,
                     show_default=True, help="Seconds between re-publishing the model config and logging the swarm's "
                     "size."),
        click.option("--members-only", is_flag=True,
                     help="With --new-swarm: an invite-only swarm; records and requests of keys without a certificate "
                     "from 'swarm-bootstrap invite' are ignored."),
        click.option("--revocations", default=BootstrapConfig.revocations, show_default=True,
                     help="With --members-only: the file of revoked certificates ('swarm-bootstrap revoke' writes it), "
                     "re-published every refresh period."),
        click.option("--identity-work", type=click.IntRange(0, MAX_WORK_BITS), default=0, show_default=True,
                     help="With --new-swarm: the price of an identity, in leading zero bits of scrypt work bound to a "
                     f"peer's key and peer id (each bit doubles it; {RECOMMENDED_BITS}: about 4 minutes of one core "
                     "per peer, once); records without it are ignored. 0: identities are free."),
        click.option("--identity-work-memory", type=click.IntRange(1, 16), default=IdentityWork(bits=0).log2_n,
                     hidden=True, help="log2 of scrypt's n for --identity-work (each try takes 2^N x 1 KiB; tests make "
                     "it cheap)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@click.group("swarm-bootstrap", cls=Group, invoke_without_command=True)
@node_options
@click.pass_context
def bootstrap_group(context: click.Context, **node: object) -> None:
    """Run a stable DHT entry point and print the options others join with, on one line; or, with a
    command below, manage the members of an invite-only swarm."""
    if context.invoked_subcommand is None:
        run_node(**node)
        return
    given = [p.opts[0] for p in context.command.params if p.name in node and
             context.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]  # fmt: skip
    if given:
        command = context.invoked_subcommand
        raise click.UsageError(f"{given[0]} is an option of the node (swarm-bootstrap with no command), not of "
                               f"'{command}': give that command's options after its name")  # fmt: skip


@bootstrap_group.command("run", hidden=True)
@node_options
def run_alias(**node: object) -> None:
    """Run the node: what `swarm-bootstrap` with no command does (older command lines say `run`)."""
    run_node(**node)


def run_node(new_swarm: bool, config_path: str | None, creator_key: str, refresh_period: float, members_only: bool,
             revocations: str, identity_work: int, identity_work_memory: int, **kwargs) -> None:  # fmt: skip
    """Run a stable DHT entry point; print the options others join with on one line."""
    swarm, creator = kwargs.pop("swarm"), kwargs.pop("creator")
    network = network_options(kwargs)
    if network.identity_path is None:
        network.identity_path = DEFAULT_IDENTITY
    model = ModelConfig.from_json_file(config_path) if new_swarm else None
    work = IdentityWork(bits=identity_work, log2_n=identity_work_memory) if identity_work else None
    config = BootstrapConfig(swarm, network, creator, model, creator_key, refresh_period, members_only, revocations,
                             work)  # fmt: skip
    run_bootstrap(config, on_ready=click.echo)  # echo flushes: the lab reads the line as it comes


@bootstrap_group.command("invite")
@click.option("--name", required=True, help="The member's name, as others see it (1 to 64 printable characters).")
@click.option("--member-key", required=True,
              help="The member's public key: the .pub file 'swarm-bootstrap keygen' wrote beside their key.")
@click.option("--out", required=True, help="Certificate file to write; the member joins with --certificate FILE.")
@click.option("--swarm", default="demo", show_default=True, envvar=JOIN_VARIABLES["swarm"], show_envvar=True,
              help="The swarm the certificate is good for.")
@click.option("--creator-key", default=BootstrapConfig.creator_key, show_default=True,
              help="The swarm creator's key (the one its bootstrap signs the model record with).")
@click.option("--valid-days", type=float, default=DEFAULT_VALID_DAYS, show_default=True,
              help=f"Days until the certificate expires (at most {members.MAX_VALID_DAYS}).")
def invite_command(name, member_key, out, swarm, creator_key, valid_days):
    """Sign a member certificate: the member's key counts in SWARM, as NAME, until it expires."""
    if not Path(creator_key).exists():
        raise SwarmError(f"no creator key {creator_key}: give the --creator-key the swarm was created with")
    creator, member = load_key(creator_key), members.read_public_key(member_key)
    certificate = members.issue(creator, swarm, name, member, valid_days)
    _written(out, lambda: members.write_certificate(out, certificate))
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(certificate.expires))
    click.echo(f"wrote {out}: {name} in swarm {swarm} until {until}, certificate {members.certificate_id(certificate)}")


@bootstrap_group.command("revoke")
@click.argument("certificate", required=False)
@click.option("--id", "certificate_id", default=None, help="The id of the certificate to revoke (invite printed it).")
@click.option("--revocations", default=BootstrapConfig.revocations, show_default=True,
              help="The file of revoked certificates that the swarm's bootstrap publishes.")
def revoke_command(certificate, certificate_id, revocations):
    """Revoke a member certificate (its file, CERTIFICATE, or --id): the creator's running bootstrap
    publishes the revocation within a refresh period, and peers ignore that key from then on."""
    if (certificate is None) == (certificate_id is None):
        raise SwarmError("name the certificate to revoke: its file, or --id")
    if certificate_id is not None and not re.fullmatch(r"[0-9a-f]{32}", certificate_id):
        raise SwarmError(f"--id must be the 32 hex digits invite printed, not {certificate_id!r}")
    name = ""
    if certificate is not None:
        read = members.read_certificate(certificate)
        certificate_id, name = members.certificate_id(read), read.name
    added = _written(revocations, lambda: members.revoke(revocations, certificate_id, name))
    what = f"{name} ({certificate_id})" if name else certificate_id
    click.echo(f"revoked {what} in {revocations}" if added else f"{what} was revoked already in {revocations}")


@bootstrap_group.command("keygen")
@click.argument("key_file")
def keygen_command(key_file):
    """Make a member key: KEY_FILE (keep it) and KEY_FILE.pub (send it to the swarm's creator)."""
    _written(key_file, lambda: members.write_key_pair(key_file))
    click.echo(f"wrote {key_file} and {key_file}.pub: send {key_file}.pub to the swarm's creator for a certificate")


def _written(path: str, write: Callable[[], T]) -> T:
    """What `write` returns; a file that cannot be written is one line, not a traceback."""
    try:
        return write()
    except OSError as error:
        raise SwarmError(f"cannot write {path}: {error.strerror or error}") from None


def main() -> None:
    run_command(bootstrap_group)


if __name__ == "__main__":
    main()
