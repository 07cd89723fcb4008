"""Generation across the swarm.

- server.py: remote denoising on a peer (its block's steps for a client)
- remote.py: a client that runs the blocks on swarm peers, with failover
- replicas.py: which replica the client asks for each block, and whom it bans
- cross_check.py: the confirmation rule: which of the replicas' answers is used, who is banned, who credited
- audit.py: which answers of one voice (a lone key; in an open swarm, all of a checkpoint's keys) are checked here
- vetting.py: which checkpoints a generation client uses (two keys serve them, or measured here)
- ar_pipeline.py: the autoregressive pipeline baseline of the serving benchmarks
"""
