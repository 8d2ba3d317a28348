"""Finding NIXL, choosing UCX settings, and creating an agent whose progress thread sleeps.

UCX_TLS: for host-memory KV, when the environment sets none, `tcp,cma,self` is used: CMA
(process_vm_readv) moves the bytes in one copy between processes on a host, tcp carries UCX's
active messages (connection setup, notifications) and reaches other hosts. UCX's default
selection measured slower here and `sm,self` alone cannot start (no active-message
transport). VRAM KV keeps UCX's defaults so that cuda_copy / cuda_ipc / RDMA stay available.

Progress thread: nixl's Python wrapper starts the UCX progress thread with a wakeup delay of
0, which polls without sleeping and burns a core for the life of the process. The serving
agent gets one with a delay instead: it sleeps on UCX's event descriptors and wakes on
traffic (connection setup, notifications, an owner's share of a TCP-emulated get) or every
`progress_wakeup_us`. The reading agent gets none: the driver thread progresses its READs.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from types import ModuleType
from typing import Any

from kv_transfer.errors import TransportUnavailable

logger = logging.getLogger(__name__)

_MODULES = ("nixl_cu12._api", "nixl._api", "nixl_cu13._api")


def load_nixl() -> ModuleType:
    """The NIXL Python API module; TransportUnavailable when none is installed."""
    errors = []
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
        else:
            _route_nixl_logs()
            return module
    raise TransportUnavailable("NIXL cannot be imported (" + "; ".join(errors) + ")")


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


def apply_ucx_defaults(mem_type: str, ucx_tls: str) -> str:
    """Set UCX_TLS for host memory unless the user did; returns a line for the log."""
    user = os.environ.get("UCX_TLS")
    if user is not None:
        return f"UCX_TLS={user} (from the environment)"
    if mem_type != "DRAM":
        return "UCX_TLS unset (UCX default, VRAM KV)"
    os.environ["UCX_TLS"] = ucx_tls
    return f"UCX_TLS={ucx_tls} (splitserve default for host memory)"


def create_agent(api: ModuleType, name: str, progress_wakeup_us: int | None) -> Any:
    """A UCX-backed nixl_agent. With `progress_wakeup_us`, it has a progress thread that
    sleeps between events; with None, none (its owner must progress it)."""
    bindings = api.nixlBind
    original = bindings.nixlAgentConfig
    config = api.nixl_agent_config(
        backends=["UCX"], enable_prog_thread=progress_wakeup_us is not None
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
