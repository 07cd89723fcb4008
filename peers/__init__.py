"""The peer program, swarm-peer (main.py): option parsing over `swarm.peer.life.Peer`.

Installed as the package `swarm_peer` (setup.cfg's package_dir), not under the generic name `peers`.
"""
