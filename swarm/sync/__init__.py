"""Keeping the replicas of one block in step.

- modes.py: the `--sync` modes in one table (name, what each needs from the peer, its builder)
- strategy.py: what every way of syncing offers the peer (a `typing.Protocol`), `NoSync`, and one training step
  with a strategy
- lockstep.py: `--sync demo`, DeMo with each step's gathered set applied in the same step
- overlap.py: `--sync demo-overlap`, DeMo with each step's exchange overlapped with the next steps
- outer.py: `--sync outer` and `outer-overlap`, H local steps, then an outer step on the compressed
  pseudo-gradients
- dense.py: dense averaging of gradients with hivemind's averager (`--sync dense`, the baseline; it trusts
  every groupmate)
- compression.py: DeMo compression of momentum (tiled DCT, top-k, error feedback, bit packing)
- decoupled_momentum.py: one replica's DeMo optimizer and its payload wire format
- pseudo_gradient.py: one replica's outer optimizer (anchor, error buffer, the majority's range) and its payload
  wire format
- exchange.py: the payload exchange a strategy drives (publish, gather, decode in order, drift, a majority ahead)
- transport.py: the exchange's payloads between peers over P2P (the payload service, the gather)
- in_process.py: the exchange's payloads between replicas in one process (benchmarks)
- reconcile.py: drifted replicas brought back together by a robust median of their checkpoints
"""
