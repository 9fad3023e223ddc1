"""The quantized weights in one buffer on 2 MB pages.

A decode step streams every weight once; with each matrix in its own allocation on 4 KB pages,
every matrix restarts the hardware prefetcher's streams and every page costs a TLB miss. Linux
backs memory with transparent huge pages where asked (`madvise`, the usual `enabled` setting) if
the request comes before the memory is first touched. Measured here: 60 Q4_1 3072 x 576 matrices
at one row, each in its own allocation 6.10 ms, in one buffer 5.72 ms, that buffer on huge pages
5.07 ms; a batch-1 engine step about 0.9 ms faster. The KV pool stays on small pages: a gigabyte
asked for at once made page faults wait on memory compaction for minutes on a fragmented machine
(with the weights' ~100 MB it costs 0.1-2 s at start). Where the kernel or the OS does not take the
advice, the buffer works the same on small pages.
"""

import ctypes
import ctypes.util
import functools
import logging
import sys

import torch

from tokenyard.engine.quant import QuantizedTensor

log = logging.getLogger("tokenyard.engine")

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h
ALIGN = 64  # each weight array starts on a cache line


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise


def advise(buffer: torch.Tensor) -> bool:
    """Ask for huge pages under the whole 2 MB pages inside `buffer`'s memory (a CPU tensor not yet
    written); whether the kernel took the request."""
    madvise = _madvise()
    start = buffer.data_ptr()
    end = start + buffer.numel() * buffer.element_size()
    first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
    if madvise is None or buffer.device.type != "cpu" or last <= first:
        return False
    if madvise(first, last - first, MADV_HUGEPAGE) != 0:
        log.info("no huge pages (madvise: errno %d)", ctypes.get_errno())
        return False
    return True


def gather(weights: list[QuantizedTensor]) -> torch.Tensor | None:
    """Move the arrays of `weights` (each tensor once) into one buffer on huge pages, in order,
    each array replaced by a view of it; the buffer (None when there is nothing to move)."""
    unique = list({id(w): w for w in weights}.values())
    names = ("qs", "scales", "mins")
    parts = [(w, name) for w in unique for name in names if getattr(w, name) is not None]
    if not parts:
        return None
    sizes = [_aligned(getattr(w, name).nbytes) for w, name in parts]
    buffer = torch.empty(sum(sizes) + HUGE_PAGE, dtype=torch.uint8)
    advise(buffer)
    offset = -buffer.data_ptr() % HUGE_PAGE  # the first array on a page boundary
    for (weight, name), size in zip(parts, sizes, strict=True):
        array = getattr(weight, name)
        view = buffer[offset : offset + array.nbytes].view(array.dtype).view(array.shape)
        view.copy_(array)
        setattr(weight, name, view)
        offset += size
    return buffer


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN
