"""The draft proposer: a smaller model of the same vocabulary guesses k tokens greedily.

It keeps its own paged KV cache (its own block manager) with one table per request it has
guessed for. Each engine step it catches up on the tokens the request gained since its last
guess (the accepted guesses' KV is already there; what follows a rejected one is
recomputed), then runs k - 1 more one-token steps, every request of the step in one batch.
Guesses are the draft's argmax: a point mass, as the verifier expects
(engine.speculative.verify).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.kv.block_manager import BlockManager
from engine.kv.sizing import SharedCache
from engine.model.attention import AttentionMetadata
from engine.model.config import ModelConfig
from engine.scheduler.request import Request
from engine.speculative.cost import StepCost
from engine.step.model_load import LoadedModel, load_model
from engine.step.runner import ModelRunner
from models.sampling_params import SamplingParams


class _Shadow:
    """A request's state in the draft's cache."""

    __slots__ = ("request", "tokens")

    def __init__(self, request_id: str, prompt: list[int]) -> None:
        self.request = Request(request_id, prompt[:1], SamplingParams(), max_model_len=1 << 30)
        self.tokens: list[int] = []  # tokens whose KV is in the draft cache, in order


def draft_runner_config(config: EngineConfig, num_blocks: int | None = None) -> EngineConfig:
    """The engine's settings as the draft's runner takes them: the draft's directory, no
    speculation of its own, one batch row, `num_blocks` blocks (the target's count), and
    no CUDA graphs (the proposer calls the model itself)."""
    assert config.draft_model is not None
    return dataclasses.replace(
        config,
        model_dir=config.draft_model,
        num_kv_blocks=num_blocks,
        kv_cache_memory_gb=None,
        speculative_method="none",
        draft_model=None,
        max_num_seqs=1,
        enforce_eager=True,
    )


def load_draft(config: EngineConfig, target: ModelConfig) -> LoadedModel:
    """The draft model's weights on the device, after its vocabulary is checked against the
    target's (ValueError naming both). Loaded before the target's KV cache is planned, so that
    the plan counts these weights and leaves room for the draft's cache (engine.kv.sizing)."""
    assert config.draft_model is not None
    draft_config = ModelConfig.from_dir(config.draft_model)
    if draft_config.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft model {str(config.draft_model)!r} has a vocabulary of "
            f"{draft_config.vocab_size} tokens, the model {target.vocab_size}: speculative "
            "decoding needs the same vocabulary"
        )
    return load_model(draft_runner_config(config), draft_config)


def draft_kv_cache(draft: LoadedModel | None) -> tuple[SharedCache, ...]:
    """What a draft model's KV cache takes from the target's budget: one block of its own
    layout per target block (nothing without a draft)."""
    if draft is None:
        return ()
    return (SharedCache("draft", draft.layout.block_bytes),)


class DraftProposer:
    """Greedy guesses from a draft model with its own KV cache."""

    def __init__(
        self,
        config: EngineConfig,
        target: ModelConfig,
        num_blocks: int,
        loaded: LoadedModel | None = None,
        cost: StepCost | None = None,
    ) -> None:
        """`num_blocks`: the target's block count, which the draft's cache takes too.
        `loaded`: the draft from load_draft (else loaded here, after the target's plan).
        `cost`: where the draft's forwards are timed (engine.speculative.cost)."""
        if loaded is None:
            loaded = load_draft(config, target)
        self.runner = ModelRunner(
            draft_runner_config(config, num_blocks), loaded.model_config, loaded=loaded
        )
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size, False)
        self.block_size = config.block_size
        self.device = self.runner.device
        self.max_len = self.runner.max_model_len
        self.max_tokens = config.max_num_batched_tokens  # per forward: the activation reserve
        self._shadows: dict[str, _Shadow] = {}
        self.cost = cost or StepCost()

    def forget(self, request_id: str) -> None:
        shadow = self._shadows.pop(request_id, None)
        if shadow is not None:
            self.blocks.free(shadow.request)

    def forget_except(self, live: set[str]) -> None:
        """Free the draft cache of requests that are no longer running."""
        for request_id in [r for r in self._shadows if r not in live]:
            self.blocks.free(self._shadows.pop(request_id).request)

    def behind(self, request: Request) -> int:
        """About how many of the request's tokens the draft has not seen (its cache may also
        hold rejected guesses past them: then fewer)."""
        shadow = self._shadows.get(request.request_id)
        return request.num_tokens - (len(shadow.tokens) if shadow is not None else 0)

    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], ks: Sequence[int]) -> list[list[int]]:
        """Up to ks[i] guesses for each request ([] where none fit the draft's cache)."""
        shadows: list[_Shadow] = []
        chunks: list[list[int]] = []
        starts: list[int] = []
        wanted: list[int] = []
        for request, k in zip(requests, ks, strict=True):
            tokens = request.all_token_ids
            k = min(k, self.max_len - len(tokens))
            shadow = self._shadows.get(request.request_id)
            if shadow is None:
                shadow = self._shadows[request.request_id] = _Shadow(request.request_id, tokens)
            same = _common_prefix(shadow.tokens, tokens)
            # always compute the last token: its logits give the first guess
            same = min(same, len(tokens) - 1)
            if k <= 0 or not self.blocks.allocate(shadow.request, len(tokens) + k - 1):
                shadows.append(shadow)
                chunks.append([])
                starts.append(same)
                wanted.append(0)
                continue
            shadow.tokens = tokens[:same]
            shadows.append(shadow)
            chunks.append(tokens[same:])
            starts.append(same)
            wanted.append(k)
        guesses: list[list[int]] = [[] for _ in requests]
        active = [i for i, k in enumerate(wanted) if k > 0]
        # A request the draft has fallen far behind on (a new prompt, a long rejected run)
        # catches up first, in forwards within the token budget; the usual few tokens (the
        # last guess and the token after it) go with the first guessing forward.
        usual = max(wanted, default=0) + 1
        behind = {i for i in active if len(chunks[i]) > usual}
        if sum(len(chunks[i]) for i in active if i not in behind) + len(behind) > self.max_tokens:
            behind = set(active)
        self._catch_up([(i, chunks[i][:-1]) for i in behind if len(chunks[i]) > 1], shadows)
        for i in behind:
            starts[i] += len(chunks[i]) - 1
            chunks[i] = chunks[i][-1:]
        for step in range(max(wanted, default=0)):
            rows = [i for i in active if wanted[i] > step]
            if not rows:
                break
            feed = [chunks[i] if step == 0 else [guesses[i][-1]] for i in rows]
            begin = [starts[i] if step == 0 else len(shadows[i].tokens) for i in rows]
            began = time.perf_counter()
            logits = self._forward(feed, begin, [shadows[i].request.block_ids for i in rows])
            best = logits.argmax(dim=-1).tolist()  # waits for the device
            self.cost.draft.add(sum(map(len, feed)), time.perf_counter() - began)
            for i, tokens_fed, token in zip(rows, feed, best, strict=True):
                shadows[i].tokens += tokens_fed
                guesses[i].append(int(token))
        for i in active:  # blocks past what the cache holds go back
            self.blocks.trim(shadows[i].request, len(shadows[i].tokens) + 1)
        return guesses

    def _catch_up(self, pending: list[tuple[int, list[int]]], shadows: list[_Shadow]) -> None:
        """Feed the draft the tokens it has not seen (pending: (row, tokens)), in forwards
        of at most max_num_batched_tokens tokens, as the target's prefill is: a request's
        whole prompt on its first guess would otherwise go through in one forward, past the
        activation memory the KV plan kept."""
        queue = deque(pending)
        while queue:
            rows: list[int] = []
            feed: list[list[int]] = []
            room = self.max_tokens
            while queue and room > 0:
                i, rest = queue.popleft()
                piece = rest[:room]
                rows.append(i)
                feed.append(piece)
                room -= len(piece)
                if len(piece) < len(rest):
                    queue.appendleft((i, rest[len(piece) :]))
            begin = [len(shadows[i].tokens) for i in rows]
            began = time.perf_counter()
            self._forward(feed, begin, [shadows[i].request.block_ids for i in rows])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.cost.catch_up.add(sum(map(len, feed)), time.perf_counter() - began)
            for i, piece in zip(rows, feed, strict=True):
                shadows[i].tokens += piece

    def _forward(
        self, feed: list[list[int]], starts: list[int], tables: list[list[int]]
    ) -> torch.Tensor:
        meta = AttentionMetadata.build(
            [len(f) for f in feed], starts, tables, self.block_size, self.device
        )
        ids = torch.tensor([t for f in feed for t in f], dtype=torch.int64, device=self.device)
        ends = torch.tensor([len(f) for f in feed], device=self.device).cumsum(0) - 1
        logits = self.runner.model(ids, meta, self.runner.kv_cache, ends)
        return logits.float()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
