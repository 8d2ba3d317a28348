"""A tiny Qwen3-shaped model whose greedy output is scripted: a bigram chain of token ids.

Every layer's o_proj and down_proj are zero, so the residual stream carries the token's
embedding to the final norm untouched. The chain's tokens get orthogonal embeddings of unit
RMS (the final norm leaves them as they are) and each one's successor an lm_head row equal to
its embedding, so the successor's logit is `SCALE * hidden` and every other logit 0: greedy
decoding follows the chain whatever came before. A token may appear in the chain once (it
has one successor). Tests serve it with a real engine where a fake node would script tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

SCALE = 4.0  # the successor's logit is SCALE * hidden; every other one 0


def save_scripted_model(
    path: Path, vocab_size: int, chain: Sequence[int], eos_token_id: int, hidden: int = 64
) -> None:
    """A model in `path` whose argmax after `chain[i]` is `chain[i + 1]` (all distinct)."""
    if len(set(chain)) != len(chain) or len(chain) > hidden:
        raise ValueError(f"the chain needs distinct tokens, at most {hidden} of them")
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=1024, tie_word_embeddings=False, eos_token_id=eos_token_id,
        bos_token_id=None, pad_token_id=eos_token_id,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()
    basis = torch.linalg.qr(torch.randn(hidden, hidden))[0].T * hidden**0.5  # RMS 1 rows
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        for i, token in enumerate(chain):
            model.model.embed_tokens.weight[token] = basis[i]
        for i, successor in enumerate(chain[1:]):
            model.lm_head.weight[successor] = basis[i] * SCALE
    model.save_pretrained(path)
