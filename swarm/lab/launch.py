"""Start a swarm of real processes on this machine: the demo, the tests and the benchmarks share it.

`LocalSwarm` runs the installed programs (swarm-bootstrap, swarm-peer, ...) as separate
processes on 127.0.0.1, keeps each one's log in its work folder, and stops every process
it started when it is closed, also after a failure. Given a `NetLab`, it runs each process
on its own emulated host instead (a network namespace named after the process).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

from swarm.errors import SwarmError
from swarm.lab.netlab import NetLab, Node
from swarm.p2p import members
from swarm.p2p.bootstrap import JOIN_VARIABLES
from swarm.p2p.client import SwarmClient
from swarm.p2p.members import Credentials
from swarm.p2p.network import NetworkOptions, load_key
from swarm.schema import PEER_ENVVAR_PREFIX

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 15.0
BOOTSTRAP_TIMEOUT_S = 60.0
HEALTH_START_TIMEOUT_S = 60.0  # joining the swarm, reading the model, a first poll


def command_path(name: str) -> str:
    """The console script of this environment (next to its python), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise SwarmError(f"{name} is not installed (pip install -e .)")
    return found


@dataclass
class Started:
    name: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def peak_rss(self) -> int | None:
        """The peak resident memory in bytes of this process and every process under it (its DHT,
        its libp2p daemon), each one's peak summed, since it started or since `reset_peak_rss`;
        None once it has exited. Linux only (VmHWM in /proc/PID/status)."""
        if self.process.poll() is not None:
            return None
        return sum(_read_peak_rss(pid) for pid in _process_tree(self.process.pid))

    def reset_peak_rss(self) -> None:
        """Start this process's and its children's peaks over from their present resident memory."""
        for pid in _process_tree(self.process.pid):
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak RSS (proc(5))
            except OSError:  # exited meanwhile
                pass


@dataclass
class LocalSwarm:
    """A bootstrap node and peers of one swarm, as processes on 127.0.0.1."""

    workdir: Path
    swarm: str = "demo"
    config_path: str | None = None  # model config JSON for the new swarm (None: built-in)
    data: str | None = None  # text source for the peers (None: built-in corpus)
    threads_per_process: int = 1
    initial_peers: list[str] = field(default_factory=list)
    join_args: list[str] = field(default_factory=list)  # the line the bootstrap printed, as arguments
    creator: str | None = None
    started: list[Started] = field(default_factory=list)
    lab: NetLab | None = None  # if set, each process runs on the lab's host of its name

    def __enter__(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _env(self) -> dict:
        """This environment for the swarm's processes, less the join line's variables and swarm-peer's
        options (`BLOCKSWARM_PEER_...`): they join this swarm by its own options, and must not pick up a
        real swarm's creator or addresses, or a device or folder, from a user's shell."""
        threads = str(self.threads_per_process)
        kept = {k: v for k, v in os.environ.items()
                if k not in JOIN_VARIABLES.values() and not k.startswith(PEER_ENVVAR_PREFIX + "_")}  # fmt: skip
        return {**kept, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}

    def _placed(self, name: str, args: list[str]) -> list[str]:
        """The command line that runs `args` on this process's host: 127.0.0.1, or its lab namespace."""
        if self.lab is None:
            return args
        node = self.lab.nodes.get(name) or self.lab.add_node(name)
        return [*node.exec_prefix(), *args, "--host-maddrs", f"/ip4/{node.address}/tcp/0"]

    def _spawn(self, name: str, args: list[str], stdout=None) -> Started:
        log_path = self.workdir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                self._placed(name, args), stdout=stdout or log, stderr=log, cwd=self.workdir, env=self._env(),
                start_new_session=True,
            )  # fmt: skip
        handle = Started(name, process, log_path)
        self.started.append(handle)
        return handle

    def start_bootstrap(self, refresh_period: float = 5.0, extra: list[str] = ()) -> list[str]:
        """Start the bootstrap node (creating the swarm), keep the join line it prints
        (`--swarm S --creator F --initial-peers ...`) and return its initial peers."""
        args = [command_path("swarm-bootstrap"), "--swarm", self.swarm, "--new-swarm",
                "--identity", str(self.workdir / "bootstrap.id"), "--refresh-period", str(refresh_period),
                *extra]  # fmt: skip
        if self.config_path:
            args += ["--config", self.config_path]
        handle = self._spawn("bootstrap", args, stdout=subprocess.PIPE)
        line = _read_line(handle, BOOTSTRAP_TIMEOUT_S)
        args = line.split()
        if not line.startswith("--swarm ") or "--initial-peers" not in args:
            raise SwarmError(f"bootstrap did not start: {line or handle.log()[-2000:]}")
        self.join_args = args
        self.initial_peers = [value for option, value in itertools.pairwise(args) if option == "--initial-peers"]
        self.creator = args[args.index("--creator") + 1] if "--creator" in args else None
        return self.initial_peers

    def invite(self, name: str, valid_days: float = 1.0, issued: float | None = None) -> list[str]:
        """A member key and a certificate for `name` (issued at `issued`, default now), signed with the
        bootstrap's creator key as `swarm-bootstrap invite` would: the options a command joins with."""
        folder = self.workdir / "members"
        key = members.write_key_pair(folder / f"{name}.key")
        certificate = members.issue(load_key(self.workdir / "creator.key"), self.swarm, name, key.get_public_key(),
                                    valid_days, now=issued)  # fmt: skip
        members.write_certificate(folder / f"{name}.cert", certificate)
        return ["--member-key", str(folder / f"{name}.key"), "--certificate", str(folder / f"{name}.cert")]

    def credentials(self, name: str) -> Credentials:
        """What `invite(name)` made, loaded (for a client or a node in this process)."""
        folder = self.workdir / "members"
        return members.load_credentials(str(folder / f"{name}.key"), str(folder / f"{name}.cert"))

    def revoke(self, name: str) -> None:
        """Revoke `name`'s certificate as `swarm-bootstrap revoke` would: the bootstrap publishes it
        at its next refresh."""
        certificate = members.read_certificate(self.workdir / "members" / f"{name}.cert")
        members.revoke(self.workdir / "revoked.json", members.certificate_id(certificate), name)

    def checkpoint_dir(self, name: str) -> Path:
        """The folder where the peer started as `name` keeps its checkpoints."""
        return self.workdir / name

    def peer_args(self, name: str, block: str = "auto", extra: list[str] = ()) -> list[str]:
        args = [command_path("swarm-peer"), *self.join_args, "--block", block, "--public-name", name,
                "--checkpoint-dir", str(self.checkpoint_dir(name))]  # fmt: skip
        if self.data:
            args += ["--data", self.data]
        return args + list(extra)

    def start_peer(self, name: str, block: str = "auto", extra: list[str] = ()) -> Started:
        return self._spawn(name, self.peer_args(name, block, extra))

    def start_health(self, extra: list[str] = ()) -> str:
        """Start swarm-health on a free port of 127.0.0.1 (unless `extra` names one) and return the
        page's address, the line it prints once it serves."""
        args = [command_path("swarm-health"), *self.join_args, "--port", "0", *extra]
        handle = self._spawn("health", args, stdout=subprocess.PIPE)
        line = _read_line(handle, HEALTH_START_TIMEOUT_S)
        if not line.startswith("http://"):
            raise SwarmError(f"swarm-health did not start: {line or handle.log()[-2000:]}")
        return line

    def run(
        self, name: str, *args: str, timeout: float = 300.0, subcommand: str | None = None, host: str = "client"
    ) -> subprocess.CompletedProcess:
        """Run a client command (swarm-fetch, swarm-status, swarm-bench latency, ...) against this
        swarm and wait for it; in a lab, on the host named `host`."""
        command = [command_path(name), *([subcommand] if subcommand else [])]
        argv = self._placed(host, [*command, *self.join_args, *args])
        return subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=timeout, cwd=self.workdir, env=self._env()
        )

    def latency(self, host: str, out: Path, options: Sequence[str] = (), timeout: float = 300.0) -> dict:
        """Run `swarm-bench latency` with `options` on `host` (see `run`) and return the latency.json it
        wrote in `out`; SwarmError with the end of its stderr if it failed."""
        done = self.run("swarm-bench", *options, "--out", str(out), subcommand="latency", host=host, timeout=timeout)
        if done.returncode != 0:
            raise SwarmError(f"swarm-bench latency on {host} failed: {done.stderr[-2000:]}")
        logger.info("swarm-bench latency from %s:\n%s", host, done.stdout)
        return json.loads((out / "latency.json").read_text())

    def client(self, host: str = "client", credentials: Credentials | None = None) -> SwarmClient:
        """A client of this swarm in this process (a member's, given `credentials`); in a lab, its
        DHT and libp2p daemon run on the node `host` (this process talks to them through a unix socket)."""
        if self.lab is None:
            network = NetworkOptions(initial_peers=list(self.initial_peers))
            return SwarmClient(self.swarm, network, self.creator, credentials)
        node = self.lab.nodes.get(host) or self.lab.add_node(host)
        network = NetworkOptions(initial_peers=list(self.initial_peers), host_maddrs=[f"/ip4/{node.address}/tcp/0"])
        return _ClientOnNode(self.swarm, network, self.creator, node, credentials)

    def check_running(self) -> None:
        """SwarmError naming a started process that has exited (with the end of its log)."""
        for handle in self.started:
            if handle.process.poll() is not None:
                raise SwarmError(f"{handle.name} exited early; its log ends: {handle.log()[-300:]!r}")

    def status_rows(self, host: str = "client") -> list[dict]:
        """`swarm-status --json` rows, run as a command (in a lab: on the node `host`); [] if it fails."""
        status = self.run("swarm-status", "--json", timeout=60, host=host)
        return json.loads(status.stdout)["hosts"] if status.returncode == 0 else []

    def serving(self, names: list[str], host: str = "client") -> list[dict]:
        """The status rows of the peers `names` once every one of them is serving, else []."""
        rows = {r["public_name"]: r for r in self.status_rows(host)}
        return [rows[n] for n in names] if all(rows.get(n, {}).get("state") == "serving" for n in names) else []

    def stop(self, handle: Started, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Send a signal and wait; SIGKILL if it has not exited in `timeout`. Returns the exit code."""
        if handle.process.poll() is None:
            handle.process.send_signal(sig)
            try:
                handle.process.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %.0fs after signal %d; killing it", handle.name, timeout, sig)
                os.killpg(handle.process.pid, signal.SIGKILL)
                handle.process.wait()
        return handle.process.returncode

    def end(self, handle: Started) -> None:
        """Stop a process (see `stop`), then kill the children a killed one left behind (its DHT, p2pd)."""
        self.stop(handle)
        _kill_group(handle.process.pid)

    def close(self) -> None:
        for handle in reversed(self.started):
            self.end(handle)


class _ClientOnNode(SwarmClient):
    """A SwarmClient whose DHT process (and the daemon it starts) are forked on a lab node."""

    def __init__(self, swarm: str, network: NetworkOptions, creator: str | None, node: Node,
                 credentials: Credentials | None = None):  # fmt: skip
        super().__init__(swarm, network, creator, credentials)
        self.node = node

    def __enter__(self) -> SwarmClient:
        with self.node.inside():
            return super().__enter__()


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants now ([] once it has exited)."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


def _read_peak_rss(pid: int) -> int:
    """VmHWM of `pid` in bytes (0 if it has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    line = next((line for line in status.splitlines() if line.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) * 1024


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_line(handle: Started, timeout: float) -> str:
    """One line of a process's stdout, waiting at most `timeout` (empty if it exits or times out)."""
    deadline = time.monotonic() + timeout
    stream = handle.process.stdout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            return stream.readline().decode(errors="replace").strip()
        if handle.process.poll() is not None:
            return ""
    return ""
