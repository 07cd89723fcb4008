"""A peer's memory beyond its tensors: the C allocator's hold on memory that torch has freed.

torch takes a CPU tensor's memory from the C library's malloc. glibc serves a large request
(over its mmap threshold, 128 KiB at start) with a mapping of its own and returns it to the
system when the tensor is freed; but each such free raises the threshold to the freed size (up
to 32 MiB), so from then on tensors of a block's sizes come from the heap, and a freed one stays
in the process, reused only where the next request fits. A training step allocates and frees
activations, gradients and optimizer temporaries of many sizes, so the heap grows past what
is ever alive at once. Measured with benchmarks/scale.py (d_model 1024, 3 layers, batch 32, on
2 cores): about 390 MB of a 52 M parameter block's peak RSS was memory freed and held.

`return_freed_memory` fixes the threshold where it starts: every large tensor is mapped and
returned when freed. The price is time, since each large tensor's pages are faulted in and
zeroed anew: with activation checkpointing, a step took 1.17 times as long at 52 M and 2.2
times at 0.39 M (benchmarks/README.md, "Cost as a block grows"). So it is the peer's
`--low-memory` choice, not a default.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value, kept from then on


def return_freed_memory() -> bool:
    """Make the C allocator map every request over 128 KiB apart and unmap it when freed, for the
    rest of this process; False where the C library is not glibc (nothing is changed there)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on, no lookup
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None or mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        logger.warning("freed memory is not returned to the system here: the C library has no glibc mallopt")
        return False
    return True
