"""A delay line for emulated regions: hold each packet the router forwards for its link's delay.

This kernel has no `tc netem`, so the router namespace of a `NetLab` sends every forwarded
packet to an NFQUEUE (`iptables ... -j NFQUEUE --queue-bypass`), and this daemon, run inside
that namespace, accepts each one when its one-way delay has passed. Packets wait in one FIFO
per (in-interface, out-interface) pair, so a link keeps its packet order. With
`--queue-bypass` the kernel lets packets through undelayed if the daemon is gone, so a
dead daemon never blackholes the lab.

    python -m swarm.lab.delayd --queue 0 --delays '{"bsw1>bsw2": 0.05, "bsw2>bsw1": 0.05}'

Prints "ready" once bound; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import select
import signal
import sys
import time
from pathlib import Path

NICENESS = -10  # the delay line stands for the network, which does not wait for the peers' CPUs
QUEUE_LENGTH = 65536  # packets the kernel may hold for us: a delay line holds a link's bandwidth x delay
SOCKET_BYTES = 16 * 1024**2


def ifindex(name: str) -> int:
    return int(Path(f"/sys/class/net/{name}/ifindex").read_text())


def main() -> None:
    from netfilterqueue import COPY_META, NetfilterQueue  # needs libnetfilter-queue: imported only here

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queue", type=int, default=0)
    parser.add_argument("--delays", required=True, help='JSON: {"in_if>out_if": seconds}')
    args = parser.parse_args()
    delays = {}
    for pair, seconds in json.loads(args.delays).items():
        into, out = pair.split(">")
        delays[ifindex(into), ifindex(out)] = float(seconds)
    lines: dict[tuple[int, int], collections.deque] = collections.defaultdict(collections.deque)

    def hold(packet) -> None:
        key = packet.indev, packet.outdev
        lines[key].append((time.monotonic() + delays.get(key, 0.0), packet))

    try:  # at the peers' priority, a packet would wait for a busy core on top of its delay
        os.setpriority(os.PRIO_PROCESS, 0, NICENESS)
    except PermissionError:
        logging.getLogger(__name__).warning("not allowed to raise its priority: delays may run long on busy cores")
    queue = NetfilterQueue()
    queue.bind(args.queue, hold, max_len=QUEUE_LENGTH, mode=COPY_META, sock_len=SOCKET_BYTES)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    print("ready", flush=True)
    fd = queue.get_fd()
    try:
        while not stopping:
            now = time.monotonic()
            for line in lines.values():
                while line and line[0][0] <= now:
                    line.popleft()[1].accept()
            due = min((line[0][0] for line in lines.values() if line), default=now + 0.05)
            try:
                ready, _, _ = select.select([fd], [], [], max(0.0, min(due - time.monotonic(), 0.05)))
            except InterruptedError:
                continue
            if ready:
                queue.run(block=False)
    finally:
        queue.unbind()


if __name__ == "__main__":
    sys.exit(main())
