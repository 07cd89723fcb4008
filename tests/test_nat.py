"""Peers behind a home router (a NAT namespace: masquerade out, nothing in) in the emulated internet.

They find out by themselves that nobody can dial them (the bootstrap dials back), join in DHT
client mode through the bootstrap's circuit relay, and are reached by asking them to dial the
caller back: a client in another region fetches a NATed peer's checkpoint and generates through
it; a NATed DeMo replica stays bit-identical to a public one, and a NATed replica averages its
parameters with a public one (hivemind's averager, in client mode). Behind a symmetric NAT (a
random port per connection, which defeats hole punching), the harder case: the dial-back needs
no hole. The cone NAT (ports kept) is the regions benchmark's home region (benchmarks/regions.py),
which reaches and serves through it; it left the suite to keep the suite's time down. Teardown leaves no
namespace (nor the iptables rules inside them) and no process.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from swarm_helpers import logs_end, wait_for, write_tiny_setup

from swarm.checkpoints.choice import SpotCheck
from swarm.lab import netlab
from swarm.lab.launch import LocalSwarm
from swarm.model.checkpoint import load_model_folder
from swarm.model.families import local_runner
from swarm.model.generate import continue_text
from swarm.p2p.reachability import ensure_direct, route
from swarm.serving.remote import RemoteBlocks
from swarm.waiting import WaitTimeout

REASON = netlab.available(nat=True)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

STEPS = 8
REPLICA = ["--max-steps", str(STEPS), "--save-every", str(STEPS), "--announce-period", "1", "--wait-for-replicas", "2",
           "--sync-deadline", "20"]  # fmt: skip
PEERS = {  # name: (block, region, options)
    "home0": ("0", "home", [*REPLICA, "--sync", "demo", "--average-every", "0"]),
    "public0": ("0", "west", [*REPLICA, "--sync", "demo", "--average-every", "0"]),
    "home1": ("1", "home", [*REPLICA, "--sync", "none", "--average-every", "0"]),
    "public1": ("1", "west", [*REPLICA, "--sync", "none", "--average-every", "0"]),
}


def announcements(client) -> dict:
    return {h.announcement.public_name: h for b in (0, 1) for h in client.directory.hosts(b)}


def all_serving(client) -> dict:
    found = announcements(client)
    return found if all(found.get(name) and found[name].announcement.state == "serving" for name in PEERS) else {}


def checkpoint(local: LocalSwarm, name: str, block: str) -> dict[str, torch.Tensor]:
    return load_file(local.workdir / name / f"block_{block}_step_{STEPS}.safetensors")


def generate(runner, config) -> bytes:
    return b"".join(continue_text(runner, config, b"The fox", max_bytes=16, steps_per_block=2, seed=3))


def test_peers_behind_a_symmetric_nat_host_serve_and_sync_through_a_relay(tmp_path):
    config_path, corpus_path = write_tiny_setup(tmp_path)
    with netlab.NetLab("bswnat", subnet=netlab.PUBLIC_SUBNET) as lab:
        router = lab.add_nat("home", symmetric=True)  # a new random port per connection
        for name, (_, region, _) in {"bootstrap": (0, "west", 0), "client": (0, "east", 0), **PEERS}.items():
            lab.add_node(name, region, behind=router if region == "home" else None)
        with LocalSwarm(tmp_path, swarm="nattest", config_path=config_path, data=corpus_path, lab=lab) as local:
            local.start_bootstrap(refresh_period=2)
            started = {name: local.start_peer(name, block, options) for name, (block, _, options) in PEERS.items()}
            with local.client("client") as client:
                try:
                    hosts = wait_for(lambda: all_serving(client), 200, "every peer serving")
                except WaitTimeout:
                    seen = {name: h.announcement.state for name, h in announcements(client).items()}
                    pytest.fail(f"not every peer serving after 200 s: {seen}\n{logs_end(started)}")
                running = lab.pids()
                reached = {name: hosts[name].announcement.reached for name in PEERS}
                assert reached == {"home0": "relayed", "public0": "direct", "home1": "relayed", "public1": "direct"}
                status = local.run("swarm-status", timeout=60, host="client")
                assert status.returncode == 0 and "relayed" in status.stdout, status.stderr[-2000:]

                # DeMo across the NAT: both replicas applied both payloads at every step
                assert hosts["home0"].announcement.sync_steps == hosts["public0"].announcement.sync_steps == STEPS
                home, public = checkpoint(local, "home0", "0"), checkpoint(local, "public0", "0")
                assert all(torch.equal(home[k], public[k]) for k in home)

                # the client reaches a NATed peer directly once it has dialed the client back
                home0 = hosts["home0"].peer_id
                assert client.run(route(client.p2p, home0), 10) != "direct"
                assert client.run(ensure_direct(client.p2p, home0), 10) == "direct"

                for name in ("public0", "public1"):  # from now on, the NATed peers serve every block
                    local.stop(started[name])
                wait_for(lambda: {"public0", "public1"}.isdisjoint(
                    n for n, h in announcements(client).items() if h.announcement.state != "leaving"),
                    30, "public replicas gone")  # fmt: skip
                fetched = local.run("swarm-fetch", "--out", str(tmp_path / "fetched"), "--data", corpus_path,
                                    timeout=180, host="client")  # fmt: skip
                assert fetched.returncode == 0, fetched.stderr[-3000:]
                manifest = json.loads((tmp_path / "fetched" / "manifest.json").read_text())
                assert manifest["blocks"]["0"]["peer_id"] == home0

                config = client.directory.wait_for_model(15)
                remote = RemoteBlocks(client.directory, client.p2p, client.loop, config,
                                      spot_check=SpotCheck.from_source(corpus_path, config))  # fmt: skip
                through_nat = generate(remote, config)
                model = load_model_folder(tmp_path / "fetched")
                assert through_nat == generate(local_runner(model.denoiser_for_block, model.config), model.config)
                assert remote.round_trips == 2 * 2  # 16 bytes: two passes through the two blocks, no retry
    assert not lab.namespaces()  # the routers' iptables rules lived in them
    assert len(running) > 2 * len(PEERS) and not any(netlab.alive(pid) for pid in running)  # peers, DHTs, p2pds
