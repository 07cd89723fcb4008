"""Keeping the replicas of one block in step.

- strategy.py: what every way of syncing offers the peer (a `typing.Protocol`)
- compression.py: DeMo compression of momentum (chunked DCT, top-k, error feedback, bit packing)
- decoupled_momentum.py: one replica's DeMo update and its payload wire format
- exchange.py: the DeMo exchange between replicas over P2P
- dense.py: dense averaging with hivemind's averager (the baseline, and the parameter rounds that bound drift)
"""
