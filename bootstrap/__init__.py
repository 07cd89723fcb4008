"""The bootstrap program, swarm-bootstrap (main.py): option parsing over `swarm.p2p.bootstrap`.

Installed as the package `swarm_bootstrap` (pyproject.toml's package-dir), not under the generic name `bootstrap`.
"""
