"""The Gated DeltaNet recurrence and its causal conv, in torch, over per-request states.

A linear-attention layer keeps, per request, the last ``kernel - 1`` inputs of its depthwise
conv ([conv_dim, kernel - 1]) and a recurrent matrix per value head ([v_heads, k_dim,
v_dim], fp32). Each token decays the matrix by ``exp(g)``, writes the delta of its value
against what the matrix predicts for its key (scaled by ``beta``), and reads the matrix with
its query:

    S = S * exp(g);  S += k (beta (v - k S))^T;  o = q S

Decodes (one token each) run batched over their states; prefill chunks token by token from
the state the request's previous chunk left (or zeros at its first).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class DeltaInputs(NamedTuple):
    """One sequence's (or a batch of decodes') inputs to the recurrence, in fp32.
    q, k: [tokens, v_heads, k_dim] (l2-normed, q scaled); v: [tokens, v_heads, v_dim];
    g (log decay), beta: [tokens, v_heads]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor


def conv_chunk(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One sequence's chunk through the causal depthwise conv + SiLU. x: [n, conv_dim];
    state: [conv_dim, kernel - 1] (updated in place to the chunk's last inputs); weight:
    [conv_dim, kernel]. Returns [n, conv_dim]."""
    n, keep = x.shape[0], state.shape[-1]
    window = torch.cat((state, x.t().to(state.dtype)), dim=-1)  # [conv_dim, keep + n]
    out = F.conv1d(window[None].to(weight.dtype), weight[:, None], groups=weight.shape[0])
    state.copy_(window[:, -keep:])
    return F.silu(out[0, :, -n:].t())  # [n, conv_dim]


def conv_decodes(x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Decodes' one token each. x: [d, conv_dim]; states: [d, conv_dim, kernel - 1] (a
    gathered copy; the caller stores it back). Returns [d, conv_dim]."""
    window = torch.cat((states, x[:, :, None].to(states.dtype)), dim=-1)  # [d, conv_dim, k]
    states.copy_(window[..., 1:])
    return F.silu((window.to(weight.dtype) * weight).sum(-1))


def recur(inputs: DeltaInputs, state: torch.Tensor) -> torch.Tensor:
    """Tokens in order over one recurrent state [v_heads, k_dim, v_dim] (fp32, updated in
    place). Returns o: [tokens, v_heads, v_dim]."""
    q, k, v, g, beta = inputs
    out = torch.empty_like(v)
    s = state
    for t in range(q.shape[0]):
        s = step(s, q[t], k[t], v[t], g[t], beta[t], out[t])
    state.copy_(s)
    return out


def step(
    s: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """One token over states s [..., v_heads, k_dim, v_dim] (q, k: [..., v_heads, k_dim]; v:
    [..., v_heads, v_dim]; g, beta: [..., v_heads]); writes o into ``out``, returns the new s."""
    s = s * g.exp()[..., None, None]
    predicted = (s * k[..., None]).sum(-2)  # [..., v_heads, v_dim]
    delta = (v - predicted) * beta[..., None]
    s = s + k[..., None] * delta[..., None, :]
    out.copy_((s * q[..., None]).sum(-2))
    return s


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / |x| over the last dim (as the FLA kernels compute it, eps inside the root)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm of x [..., d] (in fp32) times weight [d], then times silu(gate) [..., d]."""
    dtype = x.dtype
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return ((weight * normed.to(dtype)) * F.silu(gate.float())).to(dtype)
