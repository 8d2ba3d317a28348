"""The router's own OpenAPI document against a live `splitserve up` (one colocated node, the
default model, a short context): schemathesis generates requests for every operation from
/openapi.json, valid and broken; no answer is a 5xx and every answer conforms to the document
(status code, content type, headers, body schema). Generation is bounded: a fixed number of
examples per operation, derandomized, and output lengths clamped so each call stays short."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from cluster_harness import Cluster, running_cluster
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
MODEL = "smollm2"
MAX_MODEL_LEN = 128
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
CONFIG = schemathesis.Config.from_dict(
    {"phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}}}
)


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-openapi")
    args = ("--colocated", "--decode", "1", "--max-model-len", str(MAX_MODEL_LEN))
    with running_cluster(default_model_dir, run_dir, *args, "--num-kv-blocks", "64") as up:
        yield up


def _bounded(case: Any) -> None:
    """Short calls: the served model for half the bodies (so that generation runs), at most
    4 new tokens and 2 samples a call (the schema is the same at any length)."""
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str) and len(body["model"]) % 2 == 0:
        body["model"] = MODEL
    for key, most in (
        ("max_tokens", 4),
        ("max_completion_tokens", 4),
        ("max_output_tokens", 4),
        ("n", 2),
        ("best_of", 2),
    ):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            body[key] = most


EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _fuzz(operation: Any, mode: GenerationMode, seen: Counter[int]) -> Callable[[], None]:
    """A bounded Hypothesis run of `operation` that counts the status codes in `seen`."""

    @EXAMPLES
    @given(case=operation.as_strategy(generation_mode=mode))
    def conforms(case: Any) -> None:
        _bounded(case)
        seen[case.call_and_validate(checks=CHECKS, timeout=60).status_code] += 1

    return conforms


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_answer_conforms_to_the_document(cluster: Cluster, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(cluster.base_url + "/openapi.json", config=CONFIG)
    failures: dict[str, str] = {}
    statuses: dict[str, Counter[int]] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    # OpenAI side (with the Responses API's four), Anthropic's messages and count_tokens,
    # usage, probes, metrics, version, tokenizer, LoRA
    assert len(operations) == 20
    if mode is GenerationMode.NEGATIVE:  # only a body can be broken: GETs and cancel take none
        operations = [op for op in operations if len(op.body) > 0]
    for operation in operations:
        seen = statuses.setdefault(operation.label, Counter())
        conforms = _fuzz(operation, mode, seen)
        try:
            conforms()
        except Exception as exc:  # each operation's first failure, all reported together
            failures[operation.label] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    if mode is GenerationMode.POSITIVE:  # the cluster generated, not only refused
        for label in ("POST /v1/chat/completions", "POST /v1/completions", "POST /tokenize"):
            assert statuses[label][200] > 0, statuses


def test_the_document_and_the_tokenizer_endpoints_serve(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=30, trust_env=False) as http:
        doc = http.get("/openapi.json").json()
        assert {"/v1/chat/completions", "/tokenize", "/detokenize"} <= set(doc["paths"])
        assert http.get("/docs").status_code == 200
        ids = http.post("/tokenize", json={"model": MODEL, "prompt": "Paris"}).json()
        assert ids["max_model_len"] == MAX_MODEL_LEN and ids["count"] == len(ids["tokens"]) > 0
        text = http.post("/detokenize", json={"model": MODEL, "tokens": ids["tokens"]}).json()
        assert text == {"prompt": "Paris"}
