"""The peer program (swarm-peer): joins a swarm, trains its block, syncs and serves. Not built yet."""
