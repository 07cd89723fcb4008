"""Two emulated regions (network namespaces, a router that delays and caps): the project's own
ping between them finds the configured round trip, and teardown leaves nothing behind."""

from __future__ import annotations

import json

import pytest
from swarm_helpers import FAST_PEER, wait_for, write_tiny_setup

from swarm.errors import SwarmError
from swarm.lab import netlab
from swarm.lab.launch import LocalSwarm

REASON = netlab.available(delays=True)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

ONE_WAY_S = 0.040  # between the regions; 80 ms round trip


def test_round_trip_between_two_regions_matches_the_configured_delay(tmp_path):
    config_path, corpus_path = write_tiny_setup(tmp_path)
    with netlab.NetLab("bswreg") as lab:
        for name, region in (("bootstrap", "west"), ("p0", "west"), ("p1", "west"), ("client", "east")):
            lab.add_node(name, region)
        lab.start_delays(lambda a, b: 0.0 if a == b else ONE_WAY_S)
        with LocalSwarm(tmp_path, swarm="regiontest", config_path=config_path, data=corpus_path, lab=lab) as local:
            local.start_bootstrap(refresh_period=2)
            local.start_peer("p0", "0", FAST_PEER)
            local.start_peer("p1", "1", FAST_PEER)
            wait_for(lambda: local.serving(["p0", "p1"]), 180, "both blocks served", interval=2)
            out = tmp_path / "latency"
            bench = local.run("swarm-bench", "--samples", "7", "--gen-bytes", "16", "--out", str(out),
                              subcommand="latency", timeout=300)
            assert bench.returncode == 0, bench.stderr[-3000:]
            result = json.loads((out / "latency.json").read_text())
    assert not lab.namespaces()  # teardown removed every namespace it made
    rtts = {p["name"]: p["rtt_ms"] for p in result["peers"].values()}
    assert set(rtts) == {"p0", "p1"}, rtts
    configured_ms = 2000 * ONE_WAY_S
    for name, rtt in rtts.items():
        # the path's round trip is the fastest ping's (the others also waited for a peer busy training);
        # every ping, the median's half included, took at least the configured delay
        assert rtt["lost"] == 0, (name, rtt)
        assert abs(rtt["min"] - configured_ms) <= 0.1 * configured_ms, (name, rtt)
        assert rtt["median"] >= 0.9 * configured_ms, (name, rtt)
    assert result["single_pass"]["bytes"] == 16
    assert (out / "latency.png").exists()


def test_a_lab_sets_the_tcp_congestion_control_of_nodes_made_before_and_after():
    """Namespaces otherwise take the machine's default, not the one of the peers the lab stands for."""
    default = netlab.sh("sysctl", "-n", "net.ipv4.tcp_congestion_control").stdout.strip()
    other = "cubic" if default != "cubic" else "reno"
    with netlab.NetLab("bswcc") as lab:
        before = lab.add_node("before")
        lab.set_congestion(other)
        after = lab.add_node("after")
        chosen = {node.namespace: netlab.sh(*node.exec_prefix(), "sysctl", "-n",
                                            "net.ipv4.tcp_congestion_control").stdout.strip()
                  for node in (before, after)}  # fmt: skip
        with pytest.raises(SwarmError, match="no TCP congestion control"):
            lab.set_congestion("no-such-algorithm")
    assert set(chosen.values()) == {other}, chosen
