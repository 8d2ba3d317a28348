"""A rank's own NIXL agent: a rank of a multi-rank node registers its KV shard with an agent
in its own process, so readers pull each rank's cells from the rank itself (its own UCX
worker, its own NIC or GPU link where it has one) instead of all through rank 0's agent.

Rank 0's agent hands each rank a ``RankAgentSetup`` (``KVTransferAgent.rank_agents``); the
rank's process calls ``serve_rank_nixl`` on its own KV tensor (``engine.parallel``'s
``RankGroup.call_on_ranks`` runs it there) and the answer, the agent's metadata, goes into
the node's PeerInfo (``KVTransferAgent.use_rank_agents``). The agent is named after the
node's (``rank_agent_name``), so a restarted node's ranks are new agents to every reader.
Releases still go to rank 0's agent, which holds the leases; rank 0's agent also keeps every
rank's tensor registered, so a reader that knows nothing of rank agents still reads all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch

from kv_transfer.nixl_driver import NixlDriver
from kv_transfer.nixl_loader import apply_ucx_settings, create_agent, load_nixl
from kv_transfer.peer_info import rank_agent_name

logger = logging.getLogger(__name__)

_DRIVERS: list[NixlDriver] = []  # a rank's agents live as long as its process


@dataclass(frozen=True)
class RankAgentSetup:
    """What a rank's process needs to start its agent: the node's agent name and the
    node's NIXL settings."""

    node_agent: str
    ucx_tls: str | None
    progress_wakeup_us: int
    poll_interval_s: float


class RankAgent(NamedTuple):
    """A rank's own agent as the node's PeerInfo advertises it: its metadata, and where the
    rank's tensor lives in the rank's process (another address than rank 0's mapping)."""

    metadata: bytes
    base_address: int


def serve_rank_nixl(kv: torch.Tensor, rank: int, setup: RankAgentSetup) -> RankAgent:
    """Register ``kv`` (rank ``rank``'s KV tensor, in its own process) with a new NIXL agent
    that serves it until the process exits; what the node's PeerInfo advertises of it."""
    apply_ucx_settings(setup.ucx_tls)
    api = load_nixl()
    name = rank_agent_name(setup.node_agent, rank)
    driver = NixlDriver(name, setup.poll_interval_s)

    def start() -> bytes:
        agent = create_agent(api, name, progress_wakeup_us=setup.progress_wakeup_us)
        agent.register_memory(kv)
        driver.watch_notifs(agent, _stray_notif)  # keeps the agent referenced on the thread
        return bytes(agent.get_agent_metadata())

    try:
        metadata = driver.call(start)
    except BaseException:
        driver.stop()
        raise
    _DRIVERS.append(driver)
    logger.info("rank %d serves its KV with NIXL agent %s", rank, name)
    return RankAgent(metadata, kv.data_ptr())


def close_rank_agents() -> None:
    """Destroy this process's rank agents (tests; a rank's process just exits)."""
    while _DRIVERS:
        driver = _DRIVERS.pop()
        try:
            driver.call(driver.forget_agents)
        finally:
            driver.stop()


def _stray_notif(sender: str, _message: bytes) -> None:
    logger.debug("notification to a rank agent from %s ignored", sender)
