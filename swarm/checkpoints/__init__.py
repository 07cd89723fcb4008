"""Block checkpoints between peers: on disk, on the wire, and which one to believe.

- store.py: a peer's checkpoint files of its block (atomic writes, what it keeps)
- chunks.py: a checkpoint cut into 64 KiB chunks, their sha256 list, and which stream fetches which chunk
- framing.py: hivemind's stream framing, read with a bound on every message
- transfer.py: the checkpoint service a peer runs (chunk lists, chunk streams) and the calls to one host
- download.py: a download from many hosts at once, every chunk and the whole verified
- choice.py: which checkpoint of a block to believe (agreement, plausibility, a spot check)
"""
