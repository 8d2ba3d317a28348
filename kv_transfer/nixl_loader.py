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
