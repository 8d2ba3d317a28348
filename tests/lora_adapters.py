"""Random-weight LoRA adapters made with peft (the PEFT layout the engine reads), and
transformers' greedy decoding with an adapter merged: the oracle of the LoRA tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(
    base_dir: Path,
    out_dir: Path,
    seed: int,
    rank: int = 8,
    alpha: float = 16,
    targets: Sequence[str] = ALL_TARGETS,
    rslora: bool = False,
    b_scale: float = 0.5,
) -> Path:
    """Save a random adapter of the model in base_dir to out_dir. peft starts B at zero (no
    change); here B is drawn too, scaled so that the adapter changes the greedy tokens."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora,
        lora_dropout=0.0, bias="none",
    )  # fmt: skip
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * b_scale / rank**0.5)
    model.save_pretrained(out_dir)
    return out_dir


def merged_model(base_dir: Path, adapter_dir: Path | None) -> PreTrainedModel:
    """The base model with the adapter merged into its weights (None: the base model)."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is None:
        return base.eval()
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().eval()


def hf_greedy(
    model: PreTrainedModel,
    prompts: Sequence[list[int]],
    new_tokens: int,
    until_unlike: Sequence[list[int]] | None = None,
) -> list[list[int]]:
    """Greedy tokens of every prompt with transformers' own model and KV cache.
    `until_unlike`: other tokens of each prompt; a prompt stops at its first token unlike
    them (its tokens so far are the same as a full run's, only shorter)."""
    outputs = []
    with torch.inference_mode():
        for i, ids in enumerate(prompts):
            out = model(torch.tensor([ids]), use_cache=True)
            tokens = [int(out.logits[0, -1].argmax())]
            for _ in range(new_tokens - 1):
                if until_unlike is not None and tokens[-1] != until_unlike[i][len(tokens) - 1]:
                    break
                step = torch.tensor([[tokens[-1]]])
                out = model(step, past_key_values=out.past_key_values, use_cache=True)
                tokens.append(int(out.logits[0, -1].argmax()))
            outputs.append(tokens)
    return outputs


def hf_greedy_batched(
    model: PreTrainedModel, prompts: Sequence[list[int]], new_tokens: int
) -> list[list[int]]:
    """`hf_greedy` of all prompts in one left-padded batch: one forward per token instead of
    one per token and prompt. Padding and row count change the float32 products' shapes, so
    use it only where its tokens were checked equal to `hf_greedy`'s (the oracle prompts on
    the default model in float32, with and without test_lora_oracle's adapter: equal; in
    bfloat16 they are not)."""
    longest = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (longest - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    outputs: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        out = model(ids, attention_mask=mask, position_ids=positions, use_cache=True)
        for _ in range(new_tokens):
            chosen = out.logits[:, -1].argmax(-1)
            for tokens, token in zip(outputs, chosen.tolist(), strict=True):
                tokens.append(int(token))
            if len(outputs[0]) == new_tokens:
                break
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                chosen[:, None], attention_mask=mask, position_ids=positions,
                past_key_values=out.past_key_values, use_cache=True,
            )  # fmt: skip
    return outputs
