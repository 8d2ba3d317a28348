"""A tiny real model that says a chosen text, greedy: a bigram machine.

A one-layer Llama (or Qwen3: `family`) whose attention and MLP output projections are
zero, so the residual stream at every position is the token's own embedding. Chain tokens
get orthonormal embeddings (x sqrt(hidden), so the final norm leaves them as they are), and
the lm_head row of each token's successor is its predecessor's unit embedding x `MARGIN`:
after token `t` the logit of `next(t)` is MARGIN x sqrt(hidden) and every other logit is 0
(exactly, up to rounding), so greedy decoding follows the chain on any kernel and summation
order.

A chain is token ids in order: its first id is the prompt's last token, the rest what the
model says. An id may repeat only with the same successor (`successors` checks);
`spell_unused` spells text with tokens the chain does not hold yet, to repeat a text (a
special token's, say) with another successor.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from pathlib import Path

from models.tokenizer import Tokenizer

MARGIN = 10.0
HIDDEN = 64


def successors(chain: Sequence[int]) -> dict[int, int]:
    """Each chain token's successor; ValueError naming a token that has two."""
    nexts: dict[int, int] = {}
    for here, after in itertools.pairwise(chain):
        if nexts.setdefault(here, after) != after:
            raise ValueError(f"token {here} is followed by both {nexts[here]} and {after}")
    return nexts


def save_scripted_model(
    path: Path,
    chain: Sequence[int],
    vocab_size: int,
    eos_token_ids: Sequence[int],
    family: str = "Llama",
) -> Path:
    """A model of `family` (Llama or Qwen3) in `path` (config, safetensors; no tokenizer)
    that greedily continues each chain token with its successor; `eos_token_ids` end
    generation."""
    import torch
    import transformers

    nexts = successors(chain)
    tokens = sorted(set(nexts) | set(nexts.values()))
    if len(tokens) > HIDDEN:
        raise ValueError(f"the chain holds {len(tokens)} tokens; at most {HIDDEN} fit")
    config = getattr(transformers, f"{family}Config")(
        vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=list(eos_token_ids), pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "lm_head.weight")):
                param.zero_()
            elif "norm" in name:
                param.fill_(1.0)
        basis = torch.linalg.qr(torch.randn(HIDDEN, HIDDEN))[0]  # orthonormal columns
        unit = {t: basis[:, i] for i, t in enumerate(tokens)}
        for t in tokens:
            model.model.embed_tokens.weight[t] = unit[t] * HIDDEN**0.5
        for here, after in nexts.items():
            model.lm_head.weight[after] += unit[here] * MARGIN
    model.save_pretrained(path)
    return path


def spell_unused(tokenizer: Tokenizer, text: str, used: Collection[int]) -> list[int]:
    """Token ids (of the base vocabulary, none in `used` nor twice) that decode to `text`;
    ValueError when there are none."""
    pieces: dict[str, list[int]] = {}
    for token_id in range(tokenizer.vocab_size):
        piece = tokenizer.decode([token_id], skip_special_tokens=True)
        if piece and piece in text and token_id not in used:
            pieces.setdefault(piece, []).append(token_id)
    spelled = _spell(text, pieces, set(used))
    if spelled is None:
        raise ValueError(f"no spelling of {text!r} with unused tokens")
    return spelled


def _spell(text: str, pieces: dict[str, list[int]], used: set[int]) -> list[int] | None:
    if not text:
        return []
    for size in range(len(text), 0, -1):  # longest first
        for token_id in pieces.get(text[:size], []):
            if token_id in used:
                continue
            rest = _spell(text[size:], pieces, used | {token_id})
            if rest is not None:
                return [token_id, *rest]
    return None
