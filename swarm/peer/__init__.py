"""The peer: the room that wires model, p2p, checkpoints, sync and serving into one peer's life.

- config.py: `PeerConfig`, everything `swarm-peer` is told (the command line's defaults)
- announcer.py: the "announcer" thread, the block's replica list read from the DHT, and the
  announcement built from the peer's figures
- memory.py: `return_freed_memory`, the C allocator's part of `--low-memory`
- parts.py: what the join makes, one record per phase (`Entered`, `Claimed`, `Wired`, `Replica`,
  `Synced`), and `Joined`, the record of the whole join the running peer reads
- the phases, in the order a peer runs them: entering.py (its identity, the DHT, the model
  record), start.py (its block, its start weights, the start barrier), services.py (its P2P
  handle and the services it answers), replica.py (its replica of the block, and
  `replica_trainer`), sync_setup.py (its sync with the block's other replicas), training.py
  (the training loop)
- served.py: `Served`, the checkpoint it serves and announces, replaced at each save
- life.py: `Peer` (runs the phases: join, train, leave; its docstring says which thread may touch
  the weights) and `PeerHooks` (what only benchmarks hand a peer)

Import from the modules themselves; this file does nothing.
"""
