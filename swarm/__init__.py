"""BlockSwarm: train and serve a byte-level DiffusionBlocks model, one block per peer.

Where things are:
- model.py: the model config and the denoiser (one block, or the end-to-end baseline)
- autoregressive.py: the causal byte transformer baseline
- diffusion.py: the target codebook, the noise partition, the per-block loss, the single-pass sampler
- data.py: text through `datasets` into byte windows (built-in Wikipedia corpus by default)
- train.py: the training loop shared by blocks and baselines
- evaluate.py: denoise_ce, chain_ce, gen_nll, ar_ce
- checkpoint.py: safetensors files of one block and of an assembled model folder
- generate.py: text continuation by repeated single passes
- records.py: every record on the DHT (model, block announcements) and their validator
- network.py: joining the DHT with our validators; an event loop thread for P2P calls
- directory.py: one swarm's records as typed objects; block choice, freshest replica first
- transfer.py: a peer's checkpoint store, its P2P service, verified downloads
- compression.py: DeMo compression of momentum (chunked DCT, top-k, error feedback, bit packing)
- demo_step.py: one replica's DeMo update and the payload wire format; sync.py: the exchange over P2P
- serving.py: remote denoising on a peer; remote.py: running the blocks on swarm peers;
  ar_pipeline.py: the autoregressive pipeline baseline of the serving benchmark
- peer.py: the life of a peer (join, start from a replica, train, announce, serve, leave)
- launch.py: a swarm of real processes on this machine (demo, tests, benchmarks)
- cli.py: swarm-train, swarm-eval, swarm-generate; swarm_cli.py: swarm-fetch, swarm-status;
  demo.py: swarm-demo; options.py: shared swarm options; console.py: one-line errors
"""

__version__ = "0.1.0"
