"""Discovery measured, not estimated: round trips counted from a lookup's calls, and a small
swarm of announcing DHT nodes whose lookups a client traces (what benchmarks/discovery.py runs at 64)."""

from __future__ import annotations

from swarm_helpers import wait_for

from swarm.lab.discovery import AnnouncingSwarm, FindCall, LookupTrace, last_lookup, spread
from swarm.p2p.records import block_key

SWARM = "discoverytest"


def test_round_trips_follow_the_chain_of_calls_not_their_number():
    side_by_side = LookupTrace(0.3, [FindCall(0.0, 0.1, True), FindCall(0.0, 0.2, True), FindCall(0.0, 0.3, True)])
    assert (side_by_side.rpcs, side_by_side.round_trips) == (3, 1)
    # a worker sends its next call when its previous one is answered: a chain of three
    chained = LookupTrace(0.5, [FindCall(0.0, 0.1, True, found_value=True), FindCall(0.1, 0.3, True),
                                FindCall(0.0, 0.05, True), FindCall(0.3, 0.5, False)])  # fmt: skip
    assert chained.round_trips == 3
    assert chained.round_trips_to_value == 1
    # a call still in flight when the lookup returned is not waited for
    assert LookupTrace(0.2, [FindCall(0.0, 0.2, True), FindCall(0.2, None)]).round_trips == 1
    assert LookupTrace(0.1, []).round_trips == 0 and LookupTrace(0.1, []).round_trips_to_value is None


def test_spread_gives_every_block_hosts_in_several_regions():
    placed = spread(8, ["a", "b"], 4)
    assert sorted(block for _, block in placed) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all({r for r, b in placed if b == block} == {"a", "b"} for block in range(4))


def test_a_client_finds_every_host_and_its_lookups_are_traced():
    with AnnouncingSwarm(SWARM, n_blocks=2, announce_period=2.0) as swarm:
        for region, block in spread(4, ["local"], 2):
            swarm.add_node(region, block)
        swarm.start_announcing()
        with swarm.client("local") as client:
            for block in (0, 1):
                owners = {n.directory.owner_subkey for n in swarm.nodes if n.block == block}
                def found(block: int = block, owners: set = owners) -> bool:
                    return {h.owner for h in client.directory.hosts(block)} == owners

                wait_for(found, 30, f"both hosts of block {block}")
                trace = last_lookup(client.dht, block_key(SWARM, block))
                assert trace is not None and 1 <= trace.round_trips <= trace.rpcs
                assert trace.round_trips_to_value is not None and trace.seconds > 0
            writer = swarm.nodes[0]
            swarm.announce(writer, step=7)
            wait_for(lambda: any(h.owner == writer.directory.owner_subkey and h.announcement.step == 7
                                 for h in client.directory.hosts(writer.block)),
                     30, "the new announcement")  # fmt: skip
