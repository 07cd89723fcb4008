"""BlockSwarm: train and serve a byte-level DiffusionBlocks model, one block per peer.

Where things are (imports run down this list, never up):
- model/: the model, its training, evaluation, generation and checkpoint files (no network)
- p2p/: the DHT, its records, the P2P messages, identity, reachability, the bootstrap node, the swarm client
- checkpoints/: block checkpoints on disk and on the wire, and which one to believe
- sync/: keeping the replicas of a block in step (the `--sync` modes in one table, their strategies,
  the payload exchange, dense averaging)
- serving/: remote denoising and generation through the swarm
- health/: the swarm's health page (swarm-health): state collection, web server, the page
- peer/: the life of a peer, wiring the above together (its config, its announcer thread, its life)
- lab/: swarms of real processes on this machine (demo, tests, benchmarks), network namespaces, chaos, attacks
- api.py: the Python API (`swarm.load`, `swarm.connect`, `swarm.fetch`), which the commands use too
- cli/: every command-line program but swarm-peer and swarm-bootstrap (peers/ and bootstrap/)
- errors.py: the one error type a user can cause; waiting.py: waiting on a condition with a timeout;
  files.py: files and folders written whole or not at all
"""

__version__ = "0.2.0"

API = ("load", "connect", "fetch", "Model", "Swarm")  # swarm/api.py, importable from here


def __getattr__(name: str):
    """`swarm.load` and the rest of the API (api.py), imported on first use: `import swarm.model`
    alone loads no network code, and importing the package does no work."""
    if name in API:
        from swarm import api

        return getattr(api, name)
    raise AttributeError(f"module 'swarm' has no attribute {name!r}")
