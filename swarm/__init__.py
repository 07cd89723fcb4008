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
- cli.py: swarm-train, swarm-eval, swarm-generate; console.py: error handling for every command
"""

__version__ = "0.1.0"
