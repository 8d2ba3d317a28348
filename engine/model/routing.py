"""Routing a token to its experts: the router's scores, the top k, their weights.

``route`` is Mixtral's and Qwen-MoE's (a softmax over all experts, the top k, renormalised or
not). ``route_grouped`` adds DeepSeek's: sigmoid scores (V3) with a per-expert correction
bias that steers the choice but not the weights, experts in ``num_groups`` groups of which
a token may use the ``topk_groups`` best (V2: a group's best expert; V3: the sum of its best
two), and the routed weights scaled by ``scaling``. The order of operations is
transformers', so the same experts win on the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.model.specs import MoeSpec


class Routing(NamedTuple):
    weights: torch.Tensor  # [T, k] fp32
    ids: torch.Tensor  # [T, k] int64 expert ids, best first


@dataclass(frozen=True)
class Router:
    """How a block routes (``MoeSpec``'s routing fields)."""

    top_k: int
    normalize: bool
    scoring: str = "softmax"
    group_score: str = ""
    num_groups: int = 1
    topk_groups: int = 1
    scaling: float = 1.0

    @classmethod
    def of(cls, spec: MoeSpec) -> Router:
        return cls(
            spec.top_k, spec.normalize, spec.scoring, spec.group_score, spec.num_groups,
            spec.topk_groups, spec.scaling,
        )  # fmt: skip

    @property
    def plain(self) -> bool:
        """Softmax, no groups, no scaling: ``route``."""
        return self.scoring == "softmax" and not self.group_score and self.scaling == 1.0


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> Routing:
    """Softmax over all experts in fp32, the top ``top_k``, renormalised to sum to 1 when
    ``normalize`` (Mixtral always; Qwen-MoE per ``norm_topk_prob``). router_logits: [T, E]."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights /= weights.sum(dim=-1, keepdim=True)
    return Routing(weights, ids)


def route_with(
    router_logits: torch.Tensor, router: Router, bias: torch.Tensor | None = None
) -> Routing:
    """``route``, or ``route_grouped`` for a router that is not plain."""
    if router.plain and bias is None:
        return route(router_logits, router.top_k, router.normalize)
    return route_grouped(router_logits, router, bias)


def route_grouped(
    router_logits: torch.Tensor, router: Router, bias: torch.Tensor | None
) -> Routing:
    """DeepSeek's routing. router_logits: [T, E]; bias: [E] (V3's correction) or None."""
    logits = router_logits.float()
    scores = logits.sigmoid() if router.scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    choice = scores if bias is None else scores + bias.float()  # [T, E]
    if router.group_score:
        choice = _best_groups(choice, router)
    ids = torch.topk(choice, router.top_k, dim=-1)[1]  # [T, k]
    weights = scores.gather(1, ids)
    if router.normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return Routing(weights * router.scaling, ids)


def _best_groups(choice: torch.Tensor, router: Router) -> torch.Tensor:
    """choice [T, E] with the experts outside each token's ``topk_groups`` best groups
    masked (V3: -inf; V2: 0, as its softmax scores are positive)."""
    grouped = choice.view(choice.shape[0], router.num_groups, -1)  # [T, G, E / G]
    if router.group_score == "max":
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # [T, G]
    best = torch.topk(group_scores, router.topk_groups, dim=-1)[1]  # [T, topk_groups]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    fill = 0.0 if router.group_score == "max" else float("-inf")
    return grouped.masked_fill(~keep.unsqueeze(-1), fill).view_as(choice)
