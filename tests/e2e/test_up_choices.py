"""n > 1, best_of, echo and logit_bias against `splitserve up` (1 prefill + 1 decode node),
driven by the official openai client. Every response and stream chunk validates against the
openai package's types; sample 0 of a seeded n > 1 request equals the n=1 answer; the prompt
is prefilled once and imported once per request; no KV block is left behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from cluster_harness import Cluster, running_cluster
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from models.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e

LONG_PROMPT = (
    "The history of Paris spans more than two thousand years. It began as a small settlement "
    "on an island in the Seine and grew into the capital of France. Today the city is known for"
)
SHORT_PROMPT = "The capital of France is"  # prefilled on the decode node (local path)
CHAT = [{"role": "user", "content": LONG_PROMPT}]
BLOCK = 16  # the nodes' block size (the default)


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-choices")
    with running_cluster(default_model_dir, run_dir, "--num-kv-blocks", "128") as up:
        yield up


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster.openai_client()


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _chat(client: openai.OpenAI, **kwargs: Any) -> ChatCompletion:
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    return ChatCompletion.model_validate(raw.http_response.json())


def _complete(client: openai.OpenAI, **kwargs: Any) -> Completion:
    raw = client.completions.with_raw_response.create(**kwargs)
    return Completion.model_validate(_filled(raw.http_response.json()))


def _filled(body: dict[str, Any]) -> dict[str, Any]:
    """openai's types declare logprob lists of floats, finish_reason non-null; OpenAI sends
    null logprobs for echoed prompt tokens and null finish_reason until the last chunk."""
    choices = []
    for choice in body["choices"]:
        choice = choice | {"finish_reason": choice["finish_reason"] or "stop"}
        if choice["logprobs"]:
            lp = choice["logprobs"]
            choice["logprobs"] = lp | {
                "token_logprobs": [v if v is not None else 0.0 for v in lp["token_logprobs"]],
                "top_logprobs": [v if v is not None else {} for v in lp["top_logprobs"]],
            }
        choices.append(choice)
    return body | {"choices": choices}


def _idle(cluster: Cluster) -> None:
    for name, stats in cluster.wait_idle(
        cluster.node_names("prefill") + cluster.node_names("decode")
    ).items():
        load = stats.load
        assert (load.running, load.leases_held, load.free_blocks) == (0, 0, load.total_blocks), name


def test_n_with_a_seed_is_reproducible_and_prefills_once(
    client: openai.OpenAI, model: str, cluster: Cluster
) -> None:
    before = cluster.stats("prefill-0").counters, cluster.stats("decode-0").counters
    args = {"model": model, "messages": CHAT, "max_tokens": 8, "temperature": 1.0, "seed": 1234}
    first = _chat(client, n=4, **args)
    prefill, decode = cluster.stats("prefill-0").counters, cluster.stats("decode-0").counters
    again = _chat(client, n=4, **args)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1  # the samples are drawn apart
    assert all(c.finish_reason in ("stop", "length") for c in first.choices)
    single = _chat(client, n=1, **args)
    assert single.choices[0].message.content == texts[0]  # sample 0 is the n=1 answer
    assert first.usage is not None and single.usage is not None
    assert first.usage.prompt_tokens == single.usage.prompt_tokens  # counted once
    assert first.usage.completion_tokens > single.usage.completion_tokens
    # one prefill and one import; the other 3 samples prefilled beside it on the decode node
    assert prefill["requests_total"] - before[0].get("requests_total", 0) == 1
    assert decode["imports_total"] - before[1].get("imports_total", 0) == 1
    assert decode["local_prefills_total"] - before[1].get("local_prefills_total", 0) == 3
    # the 3 samples beside sample 0 found the prompt's full blocks in the prefix cache and
    # computed only the partial last block, then their decodes
    prompt, full = first.usage.prompt_tokens, (first.usage.prompt_tokens - 1) // BLOCK * BLOCK
    hits = decode["prefix_hit_tokens"] - before[1].get("prefix_hit_tokens", 0)
    computed = decode["tokens_computed"] - before[1].get("tokens_computed", 0)
    print(f"prompt={prompt} shared={hits} computed_on_decode={computed} unshared={4 * prompt}")
    assert hits >= 3 * full
    assert computed <= 3 * (prompt - full) + 4 * 8
    _idle(cluster)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_n_streams_every_choice_with_its_index(
    client: openai.OpenAI, model: str, cluster: Cluster, kind: str
) -> None:
    """Chat over the prefill pool (long prompt), completions on the local path (short)."""
    args: dict[str, Any] = {"model": model, "n": 3, "max_tokens": 6, "temperature": 1.0, "seed": 7}
    if kind == "chat":
        args["messages"] = CHAT
        create: Any = client.chat.completions.create
    else:
        args["prompt"] = SHORT_PROMPT
        create = client.completions.create
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in create(stream=True, stream_options={"include_usage": True}, **args):
        if kind == "chat":
            ChatCompletionChunk.model_validate(chunk.to_dict())
        else:
            Completion.model_validate(_filled(chunk.to_dict()))
        for choice in chunk.choices:
            piece = choice.delta.content if kind == "chat" else choice.text
            texts[choice.index] = texts.get(choice.index, "") + (piece or "")
            if choice.finish_reason is not None:
                assert choice.index not in reasons  # one finish_reason per choice
                reasons[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    assert sorted(texts) == sorted(reasons) == [0, 1, 2]
    assert usage is not None and usage.completion_tokens <= 3 * 6
    if kind == "chat":
        plain = [c.message.content for c in _chat(client, **args).choices]
    else:
        plain = [c.text for c in _complete(client, **args).choices]
    assert plain == [texts[i] for i in range(3)]  # streamed or not, the same samples
    _idle(cluster)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_prepends_the_prompt(client: openai.OpenAI, model: str, stream: bool) -> None:
    args = {"model": model, "prompt": SHORT_PROMPT, "max_tokens": 5, "temperature": 0.0}
    want = client.completions.create(**args).choices[0].text
    if not stream:
        got = _complete(client, echo=True, **args)
        assert got.choices[0].text == SHORT_PROMPT + want
        return
    text = ""
    for chunk in client.completions.create(echo=True, stream=True, **args):
        Completion.model_validate(_filled(chunk.to_dict()))
        text += chunk.choices[0].text
    assert text == SHORT_PROMPT + want


def test_echo_with_logprobs_lists_prompt_tokens_with_null_logprobs(
    client: openai.OpenAI, model: str, default_model_dir: Path
) -> None:
    raw = client.completions.with_raw_response.create(
        model=model, prompt=SHORT_PROMPT, max_tokens=3, temperature=0.0, echo=True, logprobs=1
    )
    lp = raw.http_response.json()["choices"][0]["logprobs"]
    num_prompt = len(Tokenizer.from_dir(default_model_dir).encode(SHORT_PROMPT))
    assert len(lp["tokens"]) == num_prompt + 3
    assert lp["token_logprobs"][:num_prompt] == [None] * num_prompt
    assert all(isinstance(v, float) for v in lp["token_logprobs"][num_prompt:])


def test_best_of_returns_the_most_likely_samples(client: openai.OpenAI, model: str) -> None:
    args = {"model": model, "prompt": LONG_PROMPT, "max_tokens": 6, "temperature": 1.0}
    got = _complete(client, n=2, best_of=4, seed=99, logprobs=0, **args)
    assert [c.index for c in got.choices] == [0, 1]
    scores = [sum(c.logprobs.token_logprobs or []) for c in got.choices if c.logprobs]
    assert len(scores) == 2 and scores[0] >= scores[1]
    every = _complete(client, n=4, seed=99, logprobs=0, **args)  # the same 4 samples
    best = sorted(
        (sum(c.logprobs.token_logprobs or []) for c in every.choices if c.logprobs), reverse=True
    )
    assert scores == pytest.approx(best[:2])
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(best_of=3, n=1, stream=True, **args)
    assert bad.value.body["param"] == "best_of"  # type: ignore[index]


def test_logit_bias_minus_100_keeps_a_token_out(
    client: openai.OpenAI, model: str, default_model_dir: Path
) -> None:
    tokenizer = Tokenizer.from_dir(default_model_dir)
    args = {"model": model, "prompt": SHORT_PROMPT, "max_tokens": 4, "temperature": 0.0}
    greedy = _complete(client, logprobs=0, **args)
    assert greedy.choices[0].logprobs is not None
    top = (greedy.choices[0].logprobs.tokens or [])[0]
    (banned,) = [t for t in range(tokenizer.vocab_size) if tokenizer.token_to_str(t) == top]
    biased = _complete(client, logprobs=0, logit_bias={str(banned): -100}, **args)
    assert biased.choices[0].logprobs is not None
    assert top not in (biased.choices[0].logprobs.tokens or [])
    assert biased.choices[0].text != greedy.choices[0].text
