"""Shared secrets: the cluster token that guards node endpoints and the KV handshake, and
the router's API keys.

Every comparison is constant-time (hmac.compare_digest). Tokens and keys never reach a log
line or a command line: they travel in environment variables and headers only.
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from config_kit import Secret

CLUSTER_TOKEN_HEADER = "x-splitserve-token"


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def matches_any(given: str | None, expected: Iterable[bytes]) -> bool:
    """Whether `given` equals one of `expected`; every candidate is compared in full."""
    if given is None:
        return False
    raw = given.encode()
    found = False
    for key in expected:
        found |= hmac.compare_digest(raw, key)
    return found


def token_ok(given: str | None, expected: Secret | None) -> bool:
    """The cluster token check: anything passes when no token is configured."""
    if expected is None:
        return True
    return matches_any(given, [expected.get_secret_value().encode()])


def cluster_headers(token: Secret | None) -> dict[str, str]:
    """Headers that carry `token` on a call to a node (none without a token)."""
    return {} if token is None else {CLUSTER_TOKEN_HEADER: token.get_secret_value()}


class ApiKey(NamedTuple):
    """An accepted API key and the name usage is accounted under (never the key itself)."""

    name: str
    secret: bytes


_KEY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def named_keys(entries: Iterable[str], where: str, first: int = 1) -> list[ApiKey]:
    """Keys as given, `name:key` or a bare `key` (named `key-N`, N counting from `first`).
    ValueError naming `where` and the entry's place, never the key."""
    keys = []
    for n, entry in enumerate(entries, start=first):
        name, sep, secret = entry.partition(":")
        if not sep:
            name, secret = f"key-{n}", entry
        if not _KEY_NAME.match(name) or not secret.strip():
            raise ValueError(
                f"{where}, key {n}: expected `name:key` with a name of letters, digits, "
                "`_`, `.` or `-` (at most 64) and a key after the colon"
            )
        keys.append(ApiKey(name, secret.strip().encode()))
    return keys


def find_key(given: str | None, keys: Iterable[ApiKey]) -> ApiKey | None:
    """The key `given` equals, comparing against every key in full (constant time)."""
    if given is None:
        return None
    raw, found = given.encode(), None
    for key in keys:
        if hmac.compare_digest(raw, key.secret) and found is None:
            found = key
    return found


def read_key_file(path: Path) -> list[str]:
    """API keys from a file: one per line (`name:key` or `key`); blank lines and `#`
    comments are skipped."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the API key file {path}: {exc.strerror}") from None
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        raise ValueError(f"the API key file {path} holds no key")
    return keys


def split_keys(value: str) -> list[str]:
    """Keys given as one comma-separated string."""
    return [k.strip() for k in value.split(",") if k.strip()]
