"""The swarm's network layer over hivemind: the DHT, what is written on it, and what peers say to each other.

- network.py: joining the DHT with our validators; an event loop thread for P2P calls
- records.py: every record on the DHT (model, block announcements, revocations, attestations) and their validator
- messages.py: every message one peer sends another over P2P, typed and bounded
- members.py: invite-only swarms: member certificates, the proofs peers carry, the check shared by all readers
- work.py: open swarms: the memory-hard work that prices an identity (key and peer id), and its check
- directory.py: one swarm's records as typed objects (the creator's model record, block hosts); block choice
- info.py: who a peer is (`rpc_info`) and whether it wrote the record that names it
- limits.py: per-caller limits every P2P service applies, and the gate each asks first
- gate.py: in a members-only swarm, a service's check of a caller (its rpc_info's proof of membership)
- ledger.py: verified contributions: what a peer checked of others, signed as attestations, and what counts
- pings.py: round trips between peers (what a peer announces, what the health page measures)
- reachability.py: whether a peer can be dialled, relays for one behind NAT
- client.py: a process that joins a swarm to ask it things (commands, benchmarks, tests)
- bootstrap.py: the bootstrap node (swarm-bootstrap): a stable DHT entry point that can create a swarm

Checkpoints and their transfer are swarm/checkpoints/, above this.
"""
