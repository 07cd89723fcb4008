"""The peer program, swarm-peer (main.py): option parsing over `swarm.peer.life.Peer`.

Installed as the package `swarm_peer` (pyproject.toml's package-dir), not under the generic name `peers`.
"""
