"""BlockSwarm: train and serve a byte-level DiffusionBlocks model, one block per peer.

Where things are (imports run down this list, never up):
- model/: the model, its training, evaluation, generation and checkpoint files (no network)
- p2p/: the DHT, its records, the P2P messages, checkpoint transfer, the swarm client
- sync/: keeping the replicas of a block in step (DeMo exchange, dense averaging)
- serving/: remote denoising and generation through the swarm
- peer.py: the life of a peer, wiring the above together
- lab/: swarms of real processes on this machine (demo, tests, benchmarks), network namespaces, chaos
- health/: the swarm's health page (swarm-health): state collection, web server, the page
- cli/: every command-line program
- errors.py: the one error type a user can cause; waiting.py: waiting on a condition with a timeout
"""

__version__ = "0.2.0"
