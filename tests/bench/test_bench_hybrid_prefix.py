"""bench.hybrid_prefix: the next turn resumes from the checkpoint at the previous prompt's
last block boundary, and computes whole without checkpoints."""

from __future__ import annotations

from bench.hybrid_prefix import main


def test_the_next_turn_resumes_at_the_previous_prompts_last_block_boundary() -> None:
    result = main(
        ["--shape", "qwen3-next-tiny", "--prompt-tokens", "40", "--next-tokens", "8",
         "--repeats", "1"]
    )  # fmt: skip
    assert result["with_checkpoints"]["cached_tokens"] == 32  # (40 - 1) // 16 * 16
    assert result["without"]["cached_tokens"] == 0
    assert result["token_limit"] == 48 / 16
