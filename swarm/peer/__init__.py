"""The peer: the room that wires model, p2p, checkpoints, sync and serving into one peer's life.

- config.py: `PeerConfig`, everything `swarm-peer` is told (the command line's defaults)
- announcer.py: the "announcer" thread, the block's replica list read from the DHT, and the
  announcement built from the peer's figures
- memory.py: `return_freed_memory`, the C allocator's part of `--low-memory`
- parts.py: what the join makes, one record per phase (`Entered`, `Claimed`, `Wired`, `Replica`,
  `Synced`), and `Joined`, the record of the whole join the running peer reads
- life.py: `Peer` (join, train, leave; its docstring says which thread may touch the weights),
  `PeerHooks` (what only benchmarks hand a peer) and `replica_trainer`

Import from the modules themselves; this file does nothing.
"""
