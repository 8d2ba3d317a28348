"""The router's own API description and vLLM's tokenizer endpoints, over fake nodes: the
OpenAPI document names every endpoint with its request model and answers, /docs renders it,
/tokenize and /detokenize answer as vLLM shapes them (text and chat forms), behind the API key
when one is set, with OpenAI errors for bad input."""

from __future__ import annotations

import platform
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from router_fakes import FakeNode, fake_cluster

from cluster.protocol import PROTOCOL_VERSION
from cluster.version import version
from models.tokenizer import Tokenizer
from router.app import route_paths

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]
KEY = "sk-test-0123456789"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def router(tokenizer: Tokenizer, script: list[int]) -> AsyncIterator[httpx.AsyncClient]:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with (
        fake_cluster(tokenizer, nodes) as c,
        httpx.AsyncClient(base_url=c.router_url, timeout=30) as client,
    ):
        yield client


async def test_the_document_describes_every_endpoint(router: httpx.AsyncClient) -> None:
    resp = await router.get("/openapi.json")
    assert resp.status_code == 200
    doc = resp.json()
    api = {p for p in route_paths() if not p.startswith("/dashboard")}  # the page is no API
    assert doc["openapi"].startswith("3.") and set(doc["paths"]) == api
    schemas = doc["components"]["schemas"]
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    assert {"messages", "model", "tools"} <= set(schemas["ChatCompletionRequest"]["properties"])
    ok = chat["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}
    for status in ("400", "404", "413", "429", "503"):
        error = chat["responses"][status]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/ErrorResponse"}, status
    assert "401" not in chat["responses"] and "securitySchemes" not in doc["components"]
    embeddings = doc["paths"]["/v1/embeddings"]["post"]
    body = embeddings["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/EmbeddingRequest"}
    assert {"input", "encoding_format", "dimensions"} <= set(
        schemas["EmbeddingRequest"]["properties"]
    )
    ok = embeddings["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/EmbeddingList"}
    tokenize = doc["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]
    assert len(tokenize["schema"]["anyOf"]) == 2  # the text form and the chat form
    docs = await router.get("/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text


async def test_tokenize_a_text_and_back(router: httpx.AsyncClient, tokenizer: Tokenizer) -> None:
    text = "The capital of France is Paris."
    resp = await router.post("/tokenize", json={"model": "smollm2", "prompt": text})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["tokens"] == tokenizer.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 256 and body["token_strs"] is None  # the fake nodes' length
    strs = await router.post("/tokenize", json={"prompt": text, "return_token_strs": True})
    assert strs.json()["token_strs"] == [tokenizer.token_to_str(t) for t in body["tokens"]]
    back = await router.post("/detokenize", json={"tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}


async def test_tokenize_a_conversation_as_chat_renders_it(
    router: httpx.AsyncClient, tokenizer: Tokenizer
) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    resp = await router.post("/tokenize", json={"model": "smollm2", "messages": messages})
    assert resp.status_code == 200, resp.text
    assert resp.json()["tokens"] == tokenizer.apply_chat_template(messages, True)
    bare = await router.post(
        "/tokenize", json={"messages": messages, "add_generation_prompt": False}
    )
    assert bare.json()["tokens"] == tokenizer.apply_chat_template(messages, False)
    assert bare.json()["count"] < resp.json()["count"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
        ("/tokenize", [1, 2], 400, None),
        ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
        ("/detokenize", {"model": "gpt-4", "tokens": [1]}, 404, "model"),
    ],
)
async def test_bad_input_is_an_openai_error(
    router: httpx.AsyncClient, path: str, body: Any, status: int, param: str | None
) -> None:
    resp = await router.post(path, json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    malformed = await router.post(path, content=b"{not json")
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"


async def test_with_api_keys_tokenize_needs_one_and_the_document_says_so(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with fake_cluster(tokenizer, nodes, api_key=KEY) as c, httpx.AsyncClient() as client:
        url = c.router_url
        assert (await client.post(url + "/tokenize", json={"prompt": "x"})).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        ok = await client.post(url + "/tokenize", json={"prompt": "x"}, headers=auth)
        assert ok.status_code == 200
        doc = (await client.get(url + "/openapi.json")).json()  # the document itself is open
    assert doc["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    keys = [{"apiKey": []}, {"xApiKey": []}]  # Authorization: Bearer <key> or x-api-key
    for path in ("/v1/chat/completions", "/tokenize", "/v1/messages"):
        operation = doc["paths"][path]["post"]
        assert operation["security"] == keys and "401" in operation["responses"]
    assert "security" not in doc["paths"]["/health"]["get"]


async def test_docs_load_nothing_from_the_internet(router: httpx.AsyncClient) -> None:
    """/docs renders on a machine without internet: every script, style and icon it loads
    is served by the router itself."""
    page = await router.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text)
    assert len(assets) >= 3 and all(a.startswith("/docs/assets/") for a in assets), assets
    assert "://" not in page.text
    kinds = {".js": "javascript", ".css": "text/css", ".png": "image/png"}
    for asset in assets:
        resp = await router.get(asset)
        assert resp.status_code == 200, asset
        assert kinds[asset[asset.rindex(".") :]] in resp.headers["content-type"], asset
    script = next(a for a in assets if a.endswith(".js"))
    assert "SwaggerUIBundle" in (await router.get(script)).text


async def test_version_names_the_package(router: httpx.AsyncClient) -> None:
    resp = await router.get("/version")
    assert resp.status_code == 200
    assert resp.json() == {
        "version": version(),
        "protocol_version": str(PROTOCOL_VERSION),
        "python": platform.python_version(),
    }
    assert version() != "unknown"
