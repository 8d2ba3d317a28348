"""The /v1/embeddings request (OpenAI's, with vLLM's pooling options) and its answer."""

from __future__ import annotations

import base64
import struct
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from cluster.protocol import PRIORITY_LIMIT
from router.api.requests import _Request

MAX_INPUTS = 2048  # inputs one request may carry, as OpenAI allows

Input = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(_Request):
    """POST /v1/embeddings. `input`: a text, texts, token ids or lists of token ids.
    `dimensions` is honoured only when it is the model's own width (a decoder's vectors are
    not truncatable). Extensions (vLLM's pooler options): `pooling_type` (`last` token or
    `mean` of every token) and `normalize` (unit L2 norm); the router's settings by default."""

    model: str
    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    pooling_type: Literal["last", "mean"] | None = None
    normalize: bool | None = None
    priority: int = Field(default=0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    timeout: float | None = Field(default=None, gt=0, le=86400)

    @field_validator("input")
    @classmethod
    def _inputs_are_present(cls, value: Input) -> Input:
        if isinstance(value, str) or (value and isinstance(value[0], int)):
            items: list[object] = [value]
        else:
            items = list(value)
        if not items:
            raise ValueError("at least one input is needed")
        if len(items) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs, got {len(items)}")
        for i, item in enumerate(items):
            if not item:
                raise ValueError(f"input {i} is empty")
            if isinstance(item, list) and min(item) < 0:  # type: ignore[type-var]
                raise ValueError(f"input {i}: token ids must be >= 0")
        return value

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text or its token ids."""
        value = self.input
        if isinstance(value, str) or isinstance(value[0], int):
            return [value]  # type: ignore[list-item]
        return list(value)  # type: ignore[arg-type]


def encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """The vector as floats, or as base64 of its little-endian float32 bytes (OpenAI's)."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # float, or base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """OpenAI's CreateEmbeddingResponse."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def embedding_list(
    vectors: list[list[float]], model: str, encoding_format: str, prompt_tokens: int
) -> EmbeddingList:
    """The answer: each vector as `encoding_format` asks, in input order."""
    data = [
        Embedding(index=i, embedding=encoded(v, encoding_format)) for i, v in enumerate(vectors)
    ]
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return EmbeddingList(data=data, model=model, usage=usage)
