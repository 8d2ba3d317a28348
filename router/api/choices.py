"""Several samples of one prompt (`n > 1`, `best_of`), each a RequestFlow of its own.

Sharing the prompt: sample 0 runs as a request of its own (one prefill on the prefill pool,
its KV imported once by a decode node, or a local prefill for short prompts). Once that
decode node has streamed sample 0's first token, the prompt's full KV blocks sit in its
prefix cache, and the other samples start on the same node with a local prefill of the
prompt: the prefix cache hands them the full blocks (reference counted, never copied) and
the node computes only the partial last block and samples each one's first token itself.
Should sample 0 end at token 1, or its node be gone, the others start as plain requests.

Seeds: sample 0 uses the request's seed, so it equals the `n=1` answer with that seed;
sample i > 0 uses `sample_seed(seed, i)`. Without a seed the router draws a random one
for the request, so every sample still has its own seed (and a resumed sample continues
its own draws). Each sample has its own stop strings, max_tokens, abort (when its text stops)
and resume on another decode node; the request's admission slot is held (by sample 0's
flow) until the last sample ends.

`best_of`: every sample carries its sampled tokens' logprobs; the `n` samples with the
highest cumulative logprob are returned, best first (logprobs shown only when asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from router.admission import Ticket
from router.api.objects import Usage
from router.api.render import make_usage
from router.api.text_deltas import OutputProcessor, TextDelta
from router.flow.request import FlowRequest
from router.flow.request_flow import RequestFlow
from router.flow.shared_prompt import SharedPrompt
from router.state import RouterState
from router.trail import Trail

_SEED_MASK = (1 << 63) - 1
Sink = Callable[[int, TextDelta], Awaitable[None]]


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index`: the request's own for sample 0, a 63-bit hash of
    (seed, index) for the others; None stays None."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _SEED_MASK


@dataclass
class Sample:
    """One sample: its flow, its text state and the deltas it produced."""

    index: int
    flow: RequestFlow
    output: OutputProcessor
    deltas: list[TextDelta] = field(default_factory=list)

    @property
    def cumulative_logprob(self) -> float:
        return sum(lp.logprob for d in self.deltas for lp in d.logprobs or [])


def best(samples: Sequence[Sample], n: int) -> list[Sample]:
    """The `n` samples with the highest cumulative logprob, best first (ties: lower index)."""
    return sorted(samples, key=lambda s: (-s.cumulative_logprob, s.index))[:n]


def _sample_trail(trail: Trail | None, index: int, request: FlowRequest) -> Trail | None:
    return trail.sample(index, request.request_id) if trail is not None else None


class Samples:
    """The samples of one request: start, run (streaming each delta to a sink), close."""

    def __init__(
        self,
        state: RouterState,
        request: FlowRequest,
        ticket: Ticket,
        output: Callable[[], OutputProcessor],
        count: int,
        need_logprobs: bool,
        trail: Trail | None = None,
    ) -> None:
        """`ticket` is the request's admission slot (sample 0's flow frees it); `output` makes
        a fresh OutputProcessor per sample; `need_logprobs` forces sampled-token logprobs on;
        `trail`: the request's, in its `samples` phase (each sample traces under it)."""
        sampling = request.sampling
        if need_logprobs and sampling.logprobs is None:
            sampling = replace(sampling, logprobs=0)
        if sampling.seed is None:  # a random one: each sample then draws its own
            sampling = replace(sampling, seed=secrets.randbits(63))
        self._shared = SharedPrompt()  # sample 0's prompt KV is on its decode node
        first = replace(request, sampling=sampling)
        flow = RequestFlow(state, first, ticket, trail=_sample_trail(trail, 0, first))
        self.samples = [Sample(0, flow, output())]
        for i in range(1, count):
            own = request.sibling(i, replace(sampling, seed=sample_seed(sampling.seed, i)))
            flow = RequestFlow(state, own, None, self._shared, _sample_trail(trail, i, own))
            self.samples.append(Sample(i, flow, output()))

    @property
    def first(self) -> RequestFlow:
        return self.samples[0].flow

    async def start(self) -> None:
        """Sample 0's start: what still fails with a plain HTTP status."""
        await self.first.start()

    async def run(self, sink: Sink | None = None) -> None:
        """Every sample to its end; the first failure (APIError) cancels the rest and raises."""
        tasks = [asyncio.create_task(self._run(s, sink)) for s in self.samples]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def stream(self) -> AsyncGenerator[tuple[int, TextDelta], None]:
        """(sample index, delta) as they come, from all samples interleaved."""
        queue: asyncio.Queue[tuple[int, TextDelta] | None] = asyncio.Queue()

        async def put(index: int, delta: TextDelta) -> None:
            queue.put_nowait((index, delta))

        task = asyncio.create_task(self.run(put))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (item := await queue.get()) is not None:
                yield item
            task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _run(self, sample: Sample, sink: Sink | None) -> None:
        flow = sample.flow
        try:
            if sample.index > 0:
                await flow.start()  # waits for sample 0 to share the prompt's KV
            async with aclosing(flow.events()) as events:
                async for chunk in events:
                    delta = sample.output.feed(chunk)
                    sample.deltas.append(delta)
                    if delta.text:  # the sample's TTFT / TPOT marks
                        flow.trail.sent_text()
                    if sample.index == 0 and (node_id := flow.prompt_kv_node_id) is not None:
                        self._shared.settle(node_id)
                    if sink is not None:
                        await sink(sample.index, delta)
                    if delta.finish_reason is not None:
                        break
        finally:
            if sample.index == 0:
                self._shared.settle(None)  # no-op once settled with the node
            await flow.stop()

    def usage(self) -> Usage:
        """Prompt tokens once, the completion tokens of every sample generated."""
        first = self.first
        completion = sum(s.output.num_tokens for s in self.samples)
        return make_usage(len(first.request.prompt_ids), completion, first.num_cached_tokens)

    async def close(self) -> None:
        """Close every sample; sample 0 last, as it frees the admission slot."""
        for sample in reversed(self.samples):
            await sample.flow.close()
