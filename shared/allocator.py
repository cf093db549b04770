"""The C allocator's settings for a process that computes with tensors.

Why: glibc hands a large freed block back to the kernel (unmapping it, or trimming the heap's
top), so the next step's tensors of the same size fault every page in again; a decode step of
hundreds of streams allocates tens of megabytes of activations and LM-head products each time
(docs/benchmarks.md, "Freed memory kept"). PyTorch's CPU tensors come from
malloc, so raising glibc's two thresholds keeps those blocks for reuse. vLLM's CPU backend gets
the same effect by preloading tcmalloc.

The cost: freed memory below MMAP_THRESHOLD_BYTES stays in the process for the next step, so its
resident size is its peak use, not its current one. Larger blocks are still mapped per use.
An operator's MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ wins; other C libraries are left
as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # the largest glibc accepts on 64-bit
TRIM_THRESHOLD_BYTES = 1 << 30
OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory(env: Mapping[str, str] = os.environ) -> bool:
    """Raise glibc's mmap and trim thresholds in this process; True if both took effect."""
    if any(name in env for name in OPERATOR_VARIABLES):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
