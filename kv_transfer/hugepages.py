"""Back a CPU tensor with transparent huge pages, in place.

Cross-process copies (UCX's CMA transport, process_vm_readv) pin every page of both buffers;
with 2 MiB pages instead of 4 KiB ones that costs far less, and NIXL bandwidth between two
processes on one host rises markedly (see bench/transfer.py). The content and the addresses
do not change. Linux >= 6.1 (MADV_COLLAPSE); elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time

import torch

logger = logging.getLogger(__name__)

_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25
_HUGE = 2 << 20


def use_hugepages(tensor: torch.Tensor) -> bool:
    """Ask the kernel to collapse the tensor's memory into huge pages. True if it did."""
    if tensor.device.type != "cpu" or not sys.platform.startswith("linux"):
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE  # whole huge pages inside
    if last <= first:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    began = time.perf_counter()
    if libc.madvise(first, last - first, _MADV_HUGEPAGE) != 0:
        logger.info("huge pages unavailable (madvise errno %d)", ctypes.get_errno())
        return False
    if libc.madvise(first, last - first, _MADV_COLLAPSE) != 0:
        logger.info("huge page collapse unavailable (errno %d)", ctypes.get_errno())
        return False
    logger.info(
        "KV tensor moved to huge pages: %.0f MiB in %.2f s",
        (last - first) / 2**20,
        time.perf_counter() - began,
    )
    return True
