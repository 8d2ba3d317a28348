"""Finding NIXL, choosing UCX settings, and creating an agent whose progress thread sleeps.

UCX_TLS: left to UCX unless the environment or TransferConfig.ucx_tls sets it. Between two
processes on one host UCX then reads with CMA (process_vm_readv, one copy) and carries its
active messages over tcp or shared memory; `tcp,cma,self` measured the same here (see
bench/transfer.py), and UCX's own choice keeps RDMA and CUDA transports where a host has
them. `sm,self` alone cannot start: UCX needs an active-message transport. The slowness once
blamed on UCX's defaults came from progress threads contending for the worker (below).

Progress thread: nixl's Python wrapper starts the UCX progress thread with a wakeup delay of
0, which polls without sleeping and burns a core for the life of the process. The serving
agent gets one with a delay instead: it sleeps on UCX's event descriptors and wakes on
traffic (connection setup, notifications, an owner's share of a TCP-emulated get) or every
`progress_wakeup_us`. The reading agent gets none: the driver thread progresses its READs.

Wheels: `nixl-cu12` (installed by default; it moves CPU tensors whatever torch is) and
`nixl-cu13` (`pip install 'splitserve[cuda13]'`). VRAM needs the wheel built for the CUDA
major version of torch: that one is tried first, and a NIXL for another CUDA than torch's is
refused with both versions named.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from types import ModuleType
from typing import Any

import torch

from kv_transfer.errors import TransportUnavailable

logger = logging.getLogger(__name__)

_MODULES = ("nixl_cu12._api", "nixl._api", "nixl_cu13._api")


def load_nixl() -> ModuleType:
    """The NIXL Python API module; TransportUnavailable when none is installed, or when the
    first one found is built for another CUDA major version than torch."""
    errors = []
    for name in nixl_modules(torch.version.cuda, _MODULES):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
        else:
            check_cuda_match(name, torch.version.cuda, torch.__version__)
            _route_nixl_logs()
            return module
    raise TransportUnavailable("NIXL cannot be imported (" + "; ".join(errors) + ")")


def cuda_major(version: str | None) -> int | None:
    """12 for "12.8"; None for a CPU build of torch (torch.version.cuda is None)."""
    return int(version.split(".")[0]) if version else None


def module_cuda_major(module: str) -> int | None:
    """The CUDA major version a NIXL module is built for: 13 for "nixl_cu13._api"; None for
    a module whose name does not say ("nixl._api")."""
    match = re.match(r"nixl_cu(\d+)\.", module)
    return int(match.group(1)) if match else None


def nixl_modules(torch_cuda: str | None, candidates: tuple[str, ...]) -> list[str]:
    """`candidates` in the order to try: the one built for torch's CUDA major first."""
    major = cuda_major(torch_cuda)
    if major is None:
        return list(candidates)
    return sorted(candidates, key=lambda name: module_cuda_major(name) != major)


def check_cuda_match(module: str, torch_cuda: str | None, torch_version: str) -> None:
    """TransportUnavailable naming both versions when `module` is built for another CUDA
    major version than torch; nothing to check for a CPU torch or an unnamed build."""
    nixl_major, torch_major = module_cuda_major(module), cuda_major(torch_cuda)
    if nixl_major is None or torch_major is None or nixl_major == torch_major:
        return
    raise TransportUnavailable(
        f"NIXL is nixl-cu{nixl_major}, built for CUDA {nixl_major}, but torch {torch_version} "
        f"is built for CUDA {torch_cuda}; install the NIXL for CUDA {torch_major}: "
        f"pip install 'splitserve[cuda{torch_major}]' (nixl-cu{torch_major})"
    )


def _route_nixl_logs() -> None:
    """nixl logs to stdout by its own handler; send its records through the app's logging."""
    nixl_logger = logging.getLogger("nixl")
    for handler in list(nixl_logger.handlers):
        if getattr(handler, "stream", None) is sys.stdout:
            nixl_logger.removeHandler(handler)
    nixl_logger.propagate = True


def nixl_available() -> bool:
    try:
        load_nixl()
    except TransportUnavailable:
        return False
    return True


def apply_ucx_settings(ucx_tls: str | None) -> str:
    """Set UCX_TLS from the config unless the environment has it; returns a line for the log.

    UCX reads it when an agent's context is created, so this runs before."""
    user = os.environ.get("UCX_TLS")
    if user is not None:
        return f"UCX_TLS={user} (from the environment)"
    if ucx_tls is None:
        return "UCX_TLS unset (UCX chooses its transports)"
    os.environ["UCX_TLS"] = ucx_tls
    return f"UCX_TLS={ucx_tls} (from TransferConfig.ucx_tls)"


def create_agent(
    api: ModuleType, name: str, progress_wakeup_us: int | None, telemetry: bool = False
) -> Any:
    """A UCX-backed nixl_agent. With `progress_wakeup_us`, it has a progress thread that
    sleeps between events; with None, none (its owner must progress it). `telemetry`: NIXL
    times each of its transfers (`get_xfer_telemetry`)."""
    bindings = api.nixlBind
    original = bindings.nixlAgentConfig
    config = api.nixl_agent_config(
        backends=["UCX"],
        enable_prog_thread=progress_wakeup_us is not None,
        capture_telemetry=telemetry,
    )
    if progress_wakeup_us is not None:
        try:
            bindings.nixlAgentConfig = _sleeping_config_class(original, progress_wakeup_us)
        except TypeError:  # the binding's config class cannot be subclassed in this build
            logger.warning("NIXL progress thread cannot be given a delay; it will busy-poll")
    try:
        agent = api.nixl_agent(name, config)  # reads nixlAgentConfig once, in __init__
    except Exception as exc:
        raise TransportUnavailable(f"NIXL agent with a UCX backend failed to start: {exc}") from exc
    finally:
        bindings.nixlAgentConfig = original
    if "UCX" not in agent.backends:
        raise TransportUnavailable("NIXL has no UCX backend plugin in this installation")
    return agent


def _sleeping_config_class(base: type, wakeup_us: int) -> type:
    class SleepingConfig(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, key: str, value: object) -> None:
            if key == "pthrDelay":
                value = wakeup_us
            super().__setattr__(key, value)

    return SleepingConfig
