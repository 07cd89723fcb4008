"""The swarm's network layer over hivemind: the DHT, what is written on it, and what peers say to each other.

- network.py: joining the DHT with our validators; an event loop thread for P2P calls
- records.py: every record on the DHT (model, block announcements) and their validator
- messages.py: every message one peer sends another over P2P, typed and bounded
- directory.py: one swarm's records as typed objects (the creator's model record, block hosts); block choice
- limits.py: per-caller limits every P2P service applies
- store.py: a peer's checkpoints on disk; transfer.py: its P2P service (info, downloads), verified downloads
- choice.py: which checkpoint of a block to believe (agreement, plausibility, a spot check)
- pings.py: round trips between peers (what a peer announces, what the health page measures)
- client.py: a process that joins a swarm to ask it things (commands, benchmarks, tests)
"""
