"""Issue 60: a sync mode is its module and one row of swarm/sync/modes.py's table, and nothing else.

A toy mode is registered here, in the table alone, and a real `Peer` (in this process, so that
the row it reads is the test's) joins a real swarm on 127.0.0.1 and trains with it."""

from __future__ import annotations

import dataclasses
import signal
import threading

from peers.main import peer_command, peer_config
from swarm.peer.life import Peer
from swarm.sync.modes import MODES, Mode, SyncInputs
from swarm.sync.strategy import NoSync
from swarm.waiting import wait_for


class CountingSync(NoSync):
    """The toy mode's strategy: AdamW alone, counting the updates the peer's loop asks of it."""

    def __init__(self, given: SyncInputs):
        self.module, self.updates = given.module, 0

    def update(self, trainer) -> int | None:
        self.updates += 1
        return super().update(trainer)


def test_a_mode_registered_in_the_table_alone_is_built_and_run_by_a_peer(lent_swarm, monkeypatch):
    local, client = lent_swarm
    built: list[CountingSync] = []

    def build(given: SyncInputs) -> CountingSync:
        built.append(CountingSync(given))
        return built[-1]

    monkeypatch.setitem(MODES, "toy", Mode("a toy: AdamW alone, counted", build))
    args = local.peer_args("toy-peer", "0", ["--max-steps", "4", "--save-every", "2", "--announce-period", "1"])[1:]
    with peer_command.make_context("swarm-peer", args) as context:
        values = dict(context.params)
    values.pop("serve_ar_stage"), values.pop("sync_trace")
    config = dataclasses.replace(peer_config(values), sync="toy")  # the command line read the table at import
    peer = Peer(config)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # Peer.run takes them over
    trained = threading.Event()

    def stop_once_trained() -> None:
        try:
            wait_for(lambda: peer.served.checkpoint is not None and peer.served.checkpoint.step >= 4, 120,
                     "the toy-mode peer's checkpoint of step 4")  # fmt: skip
            trained.set()
        finally:
            peer.stop()

    watcher = threading.Thread(target=stop_once_trained, daemon=True)
    watcher.start()
    try:
        peer.run()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    watcher.join(10)
    assert trained.is_set(), "the toy-mode peer did not save a checkpoint of step 4 (its log is above)"
    assert len(built) == 1 and built[0].module is peer.joined.replica.trainer.module
    assert built[0].updates == 4  # every step of the peer's loop went through the toy mode's strategy
