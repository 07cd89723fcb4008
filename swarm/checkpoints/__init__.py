"""Block checkpoints between peers: on disk, on the wire, and which one to believe.

- store.py: a peer's checkpoint files of its block (atomic writes, what it keeps)
- chunks.py: a checkpoint cut into 64 KiB chunks, their sha256 list, and which stream fetches which chunk
- framing.py: hivemind's stream framing, read with a bound on every message
- transfer.py: the checkpoint service a peer runs (chunk lists, chunk streams) and the calls to one host
- download.py: a download from many hosts at once, every chunk and the whole verified
- spot_check.py: a block's loss on windows and noise draws nobody else can know, and what looks tuned to it
- measure.py: a block's candidates downloaded, verified and spot-checked all at once, within one deadline
- choice.py: which checkpoint of a block to believe (plausibility, measured quality, then agreement) and its step
- assemble.py: a whole model from the swarm's blocks, into one model folder
"""
