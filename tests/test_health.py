"""The health page: its state over a DHT holding hostile records, the check of each host's
checkpoint against strangers that announce one they cannot serve, and the page itself in
headless Chromium over a tiny swarm of real processes (skipped where no browser can be driven)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import socket

import conftest
import hivemind
import pytest
from aiohttp.test_utils import TestClient, TestServer
from helpers import assert_one_line_error, run_command
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from swarm_helpers import FAST_PEER, tiny_swarm, wait_for

from swarm.checkpoints.store import CheckpointStore, describe
from swarm.checkpoints.transfer import BlockServicer
from swarm.health import browser
from swarm.health.app import STATIC, Board, build_app
from swarm.health.state import SwarmMonitor
from swarm.lab.hosting import CheckpointHost, InProcessNode
from swarm.model.denoiser import ModelConfig, build_block
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.info import InfoServicer
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import MAX_PINGS, BlockAnnouncement, CheckpointInfo, Ping, block_key, parse_record

# a public name as a stranger might write it: markup that would run if the page pasted it as HTML
HOSTILE = "<script>pwned=1</script><img src=x onerror=pwned=2>"
HOSTILE_VERSION = "<img src=x onerror=pwned=3>"  # versions are shorter
RECORD_LIFETIME_S = 3.0  # 3 announce periods of FAST_PEER's 1 s
POLL_PERIOD_S = 1.0
CHECK_WAIT_S = 90.0  # for the page's checks of every host to settle on a busy 2-core machine


def test_the_state_skips_malformed_records_and_keeps_what_peers_wrote_as_data(tmp_path):
    """A DHT node without our validator (an old or hostile one) holds a good entry, an impostor's,
    one with hostile strings and numbers, and two malformed ones: the state counts the malformed
    ones as skipped, verifies only the good host, and serves the rest as inert JSON."""
    config = ModelConfig(**conftest.TINY)
    store = CheckpointStore(tmp_path, config, 0, "health")
    checkpoint = store.save(build_block(config, 0), 3)
    key = RSAPrivateKey()
    owner = RSASignatureValidator(key).local_public_key
    dht = hivemind.DHT(start=True, record_validators=[RSASignatureValidator(key)])
    asker = hivemind.DHT(start=True, initial_peers=dht.get_visible_maddrs())  # libp2p cannot call itself
    loop = EventLoopThread()
    p2p, asking_p2p = loop.run(dht.replicate_p2p(), 30), loop.run(asker.replicate_p2p(), 30)
    try:
        me = dht.peer_id.to_base58()
        loop.run(InfoServicer(lambda: PeerInfo(block=0, owner=owner)).add_p2p_handlers(p2p), 30)
        loop.run(BlockServicer(0, store).add_p2p_handlers(p2p), 30)
        expiration, key0 = get_dht_time() + 60, block_key("health", 0)
        good = BlockAnnouncement(peer_id=me, state="serving", step=3, checkpoint=checkpoint, loss=2.5,
                                 pings=(Ping(peer_id="nobody", seconds=0.01),))  # fmt: skip
        hostile = BlockAnnouncement(peer_id="nobody", state="training", step=1, public_name=HOSTILE,
                                    version=HOSTILE_VERSION, loss=float("nan"), throughput=float("inf"),
                                    checkpoint_time=float("-inf"))  # fmt: skip
        entries = {owner: good.model_dump(), b"impostor": good.model_dump(), b"stranger": hostile.model_dump(),
                   b"malformed": {"peer_id": "x", "state": "hacking", "step": -1}, b"junk": b"junk"}  # fmt: skip
        for subkey, value in entries.items():
            assert dht.store(key0, value, expiration, subkey=subkey)
        directory = SwarmDirectory(dht, "health", key)
        state = settled(SwarmMonitor(directory, asking_p2p, loop.run, config, 5.0))
    finally:
        loop.close(p2p, asking_p2p)
        asker.shutdown()
        dht.shutdown()

    assert [b["skipped"] for b in state["blocks"]] == [2, 0]
    assert (state["status"], state["missing_blocks"]) == ("broken", [1])  # block 1 has no host at all
    rows = {(r["peer_id"], r["public_name"], r["verified"], r["problem"]) for r in state["hosts"]}
    assert rows == {(me, "", True, None), (me, "", False, "answers under another key than its record's"),
                    ("nobody", HOSTILE, False, "does not answer")}  # fmt: skip
    stranger = next(r for r in state["hosts"] if r["peer_id"] == "nobody")
    assert (stranger["loss"], stranger["throughput"], stranger["checkpoint_age_s"]) == (None, None, None)
    assert state["pings"] == [{"from": me, "to": "nobody", "seconds": 0.01}]
    assert [s["peer_id"] for s in state["loss_history"]["0"]] == [me]  # the NaN loss is not plotted

    # what the page renders from peers comes only through the API: there the hostile strings are
    # JSON strings, verbatim, in a response no browser takes for a page; the script writes them as text
    served = asyncio.run(fetch_page_and_state(state))
    api = json.loads(served["state"])
    assert api == json.loads(json.dumps(state))
    from_stranger = [(h["public_name"], h["version"]) for h in api["hosts"] if h["peer_id"] == "nobody"]
    assert from_stranger == [(HOSTILE, HOSTILE_VERSION)]
    assert served["type"] == "application/json" and served["nosniff"] == "nosniff"
    assert "script-src 'self'" in served["csp"]
    script = (STATIC / "health.js").read_text()
    markup_sinks = re.findall(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", script)
    assert not markup_sinks, markup_sinks


def settled(monitor: SwarmMonitor) -> dict:
    """The monitor's state once no host is waiting for its checkpoint's check (checks run in the background)."""

    def done() -> dict | None:
        state = monitor.collect()
        return state if all(h["problem"] != "not checked yet" for h in state["hosts"]) else None

    return wait_for(done, CHECK_WAIT_S, "the checks of every host's checkpoint", interval=1.0)


async def fetch_page_and_state(state: dict) -> dict:
    """The API as the real server serves it (aiohttp on 127.0.0.1), and the headers of the page and the API."""
    async with TestClient(TestServer(build_app(Board(state)), host="127.0.0.1")) as http:
        page = await http.get("/", timeout=30)
        api = await http.get("/api/v1/state", timeout=30)
        assert page.status == api.status == 200
        return {"csp": page.headers["Content-Security-Policy"], "state": await api.text(), "type": api.content_type,
                "nosniff": api.headers.get("X-Content-Type-Options")}  # fmt: skip


def announce(node: InProcessNode, block: int, checkpoint: CheckpointInfo) -> None:
    """`node`'s record for `block`, signed by its own key, announcing `checkpoint` (tried three
    times, as an honest peer's next announce periods would)."""
    record = BlockAnnouncement(peer_id=node.peer_id, state="serving", step=checkpoint.step, checkpoint=checkpoint)
    assert any(node.directory.announce(block, record, 60, wait=True) for _ in range(3)), "the DHT refused the record"


def test_a_host_is_verified_only_once_the_page_has_checked_the_checkpoint_it_announces(tmp_path):
    """Real DHT nodes on 127.0.0.1, each under its own key and answering rpc_info honestly: an
    honest host of block 0; a stranger, the only host of block 1, announcing a checkpoint (a
    made-up sha256, a plausible size) it cannot serve; a forger, the only host of block 2, serving
    random bytes under a made-up sha256. Only the honest host is verified, so only block 0 is
    healthy. The lighter check (a checkpoint past `whole_bytes`: its chunk list and one chunk)
    still turns the stranger away, but passes the forger: only the whole download checks the sha256."""
    config = ModelConfig(**{**conftest.TINY, "n_layers": 4, "n_blocks": 4})
    swarm = "healthchecks"
    honest = CheckpointHost(tmp_path / "honest", swarm, block=0, config=config)
    others = []
    try:
        stranger = CheckpointHost(tmp_path / "stranger", swarm, 1, initial_peers=honest.maddrs, config=config)
        others.append(stranger)
        forger = CheckpointHost(tmp_path / "forger", swarm, 2, initial_peers=honest.maddrs, config=config)
        others.append(forger)
        page = InProcessNode(swarm, initial_peers=honest.maddrs)
        others.append(page)
        real = honest.store.save(build_block(config, 0), 3)
        made_up = real.model_copy(update={"sha256": random.Random(0).randbytes(32).hex()})
        junk = random.Random(2).randbytes(real.size)  # under another sha256, with its own chunk list: chunks pass
        forged = describe(3, junk).info.model_copy(update={"sha256": random.Random(1).randbytes(32).hex()})
        forger.store.adopt(junk, forged)  # its service finds the file by that sha256
        for node, block, checkpoint in ((honest, 0, real), (stranger, 1, made_up), (forger, 2, forged)):
            announce(node, block, checkpoint)
        whole = settled(SwarmMonitor(page.directory, page.p2p, page.loop.run, config, 5.0))
        light = settled(SwarmMonitor(page.directory, page.p2p, page.loop.run, config, 5.0, whole_bytes=0))
    finally:
        for node in [*others, honest]:
            node.close()

    rows = {r["block"]: (r["peer_id"], r["verified"], r["check"], r["problem"]) for r in whole["hosts"]}
    assert rows.keys() == {0, 1, 2}, whole["hosts"]
    assert rows[0] == (honest.peer_id, True, "whole", None)
    assert rows[1][:3] == (stranger.peer_id, False, None)
    assert rows[1][3] == f"refused: no checkpoint of block 1 with sha256 {made_up.sha256[:12]}"
    assert rows[2][:3] == (forger.peer_id, False, None) and "does not match its announced sha256" in rows[2][3]
    blocks = [(b["healthy"], b["hosts"], b["verified"]) for b in whole["blocks"]]
    assert blocks == [(True, 1, 1), (False, 1, 0), (False, 1, 0), (False, 0, 0)]
    assert (whole["status"], whole["missing_blocks"]) == ("broken", [1, 2, 3])

    light_rows = {r["block"]: (r["verified"], r["check"]) for r in light["hosts"]}
    assert light_rows == {0: (True, "chunk"), 1: (False, None), 2: (True, "chunk")}


def test_announced_round_trips_are_bounded_and_strict():
    good = {"peer_id": "p", "state": "training", "step": 1}
    assert (
        parse_record(BlockAnnouncement, {**good, "pings": [{"peer_id": "q", "seconds": 0.5}]}).pings[0].seconds == 0.5
    )
    too_many = [{"peer_id": f"q{i}", "seconds": 0.1} for i in range(MAX_PINGS + 1)]
    for pings in (too_many, [{"peer_id": "q", "seconds": float("nan")}], [{"peer_id": "q", "seconds": "0.1"}],
                  [{"peer_id": "", "seconds": 0.1}], [{"peer_id": "q", "seconds": -1.0}], {"q": 0.1}):  # fmt: skip
        assert parse_record(BlockAnnouncement, {**good, "pings": pings}) is None, pings


def test_swarm_health_refuses_bad_options_with_one_line(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        assert_one_line_error(run_command("swarm-health", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--port", port,
                                          cwd=tmp_path), "cannot listen on 127.0.0.1:" + port)  # fmt: skip
    assert_one_line_error(run_command("swarm-health", "--port", "0", cwd=tmp_path), "--initial-peers is required")


@pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))
def test_the_page_turns_a_block_broken_without_reload_and_runs_no_peer_script(tmp_path):
    # the page's CSP forbids eval, so waits go through locators, never JS strings
    from playwright.sync_api import expect

    with tiny_swarm(tmp_path, "healthpage", {"a": "0"}) as (local, peers, client):
        local.start_peer("b", "1", [*FAST_PEER, "--public-name", HOSTILE])
        serving = lambda: any(h.announcement.state == "serving" for h in client.directory.hosts(1))
        wait_for(serving, 90, "block 1 served")
        url = local.start_health(["--poll-period", str(POLL_PERIOD_S)])
        with browser.headless_chromium() as chromium:
            page = chromium.new_page()
            dialogs = []
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(url, timeout=30_000)
            page.evaluate("window.sameDocument = true")  # gone if the page ever reloads
            expect(page.locator("#model-status")).to_have_text("healthy", timeout=30_000)
            expect(page.locator("#hosts td.block")).to_have_text(["0: healthy", "1: healthy"])
            expect(page.locator('tr[data-block="1"] td.name')).to_have_text(HOSTILE)  # shown as text
            expect(page.locator("figure[data-block] svg")).to_have_count(2)  # a loss plot per block
            announced = page.locator("#pings tbody td").filter(has_text=re.compile(r"\d"))
            expect(announced).to_have_count(2, timeout=30_000)  # a's round trip to b and b's to a

            local.stop(peers["a"], signal.SIGKILL)
            within = 1000 * (RECORD_LIFETIME_S + 2 * POLL_PERIOD_S + 5)  # 5 s of slack for a busy machine
            expect(page.locator("#model-status")).to_have_text("broken", timeout=within)
            expect(page.locator("#missing")).to_have_text(re.compile("block 0$"))
            expect(page.locator("#hosts td.block")).to_have_text(["0: broken", "1: healthy"])
            assert page.evaluate("window.sameDocument") is True
            assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0 and not dialogs
