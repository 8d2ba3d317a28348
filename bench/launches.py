"""Kernel launches of a piece of GPU work, counted with torch.profiler: the host's launch
calls (a kernel launch, or one launch of a whole CUDA graph) and the kernels the device ran."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

_HOST_CALLS = ("LaunchKernel", "GraphLaunch", "LaunchCooperativeKernel")


class Launches(NamedTuple):
    """Counted over one run of the work."""

    host_calls: int  # cudaLaunchKernel / cuLaunchKernel(Ex) / cudaGraphLaunch calls
    kernels: int  # kernels the device ran (those of a replayed graph included)


def count_launches(work: Callable[[], object]) -> Launches:
    """Run ``work`` once under the profiler, synchronised at both ends (without CUDA both
    counts are 0)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        work()
        if cuda:
            torch.cuda.synchronize()
    host = kernels = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
        elif any(call in event.name for call in _HOST_CALLS):
            host += 1
    return Launches(host, kernels)
