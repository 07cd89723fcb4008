"""Generation across the swarm.

- server.py: remote denoising on a peer (its block's steps for a client)
- remote.py: a client that runs the blocks on swarm peers, with failover
- cross_check.py: checking one replica's answers against others'
- vetting.py: which checkpoints a generation client uses (two keys serve them, or measured here)
- ar_pipeline.py: the autoregressive pipeline baseline of the serving benchmarks
"""
