"""The peer program, swarm-peer (main.py): a thin click wrapper over `swarm.peer.Peer`."""
