"""glibc's allocator policy for host memory: which allocations are mappings of their own, returned to the system
when freed (``map_large_allocations``), for the run (``loops/run.py``, the sampler process of ``loops/overlap.py``)
and, lower, while sampling (``Engine.sampling``).
"""

from __future__ import annotations

import ctypes
import functools
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MAPPED_BYTES = 8 << 20  # allocations at least this large are mappings of their own (map_large_allocations)
SAMPLED_BYTES = 1 << 20  # the same while sampling (Engine.sampling)


def map_large_allocations(nbytes: int = MAPPED_BYTES) -> None:
    """From now on, let every host allocation of at least ``nbytes`` be a mapping of its own, returned to the system
    when freed.

    glibc serves smaller blocks from a heap that freed tensors fragment, and raises that threshold (up to 32 MiB) as
    large blocks are freed; micro-batch after micro-batch the heap then keeps hundreds of MiB it cannot give back,
    and peak memory grew with the number of micro-batches (64 samples of the scaling benchmark: 1,928 MiB; 1,689
    MiB with the threshold fixed at 8 MiB, 1,656 MiB at 1 MiB). Mapping costs page faults: at 1 MiB a step of
    long_sums took 0.43 s against 0.34 s unmapped, at 8 MiB 0.35 s. ``loops/run.py`` sets 8 MiB before anything
    else; ``Engine.sampling`` 1 MiB inside it. Linux with glibc only.
    """
    mallopt = glibc_mallopt()
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, nbytes)


@functools.cache
def glibc_mallopt():
    """glibc's ``mallopt``, or None (not Linux; another C library, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
