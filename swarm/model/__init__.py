"""The model, with no network in it: everything one machine needs to train and use blocks.

- denoiser.py: the model config and the denoiser (one block, or the end-to-end baseline)
- diffusion.py: the target codebook, the noise partition, the per-block loss, the single-pass sampler
- autoregressive.py: the causal byte transformer baseline
- data.py: text through `datasets` into byte windows (built-in Wikipedia corpus by default)
- train.py: the training loop shared by blocks and baselines
- evaluate.py: denoise_ce, chain_ce, gen_nll, ar_ce
- generate.py: text continuation by repeated single passes
- checkpoint.py: safetensors files of one block and of an assembled model folder

Nothing here imports hivemind (a test keeps it so).
"""
