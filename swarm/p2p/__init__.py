"""The swarm's network layer over hivemind: the DHT, what is written on it, and what peers say to each other.

- network.py: joining the DHT with our validators; an event loop thread for P2P calls
- records.py: every record on the DHT (model, block announcements) and their validator
- messages.py: every message one peer sends another over P2P, typed and bounded
- directory.py: one swarm's records as typed objects; block choice, freshest replica first
- limits.py: per-caller limits every P2P service applies
- transfer.py: a peer's checkpoint store, its P2P service, verified downloads
- pings.py: round trips between peers (what a peer announces, what the health page measures)
- client.py: a process that joins a swarm to ask it things (commands, benchmarks, tests)
"""
