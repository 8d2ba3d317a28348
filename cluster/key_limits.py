"""Limits per API key: requests and tokens per minute, by key name.

Written `name:rpm=N,tpm=N` entries separated by `;`, e.g. `alice:rpm=60,tpm=20000;*:rpm=600`;
`*` applies to every key without an entry of its own; a limit left out is unlimited.
"""

from __future__ import annotations

from dataclasses import dataclass

EVERY_KEY = "*"


@dataclass(frozen=True)
class KeyLimit:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


def parse_key_limits(text: str) -> dict[str, KeyLimit]:
    """{key name: limit}. ValueError naming the entry that does not parse."""
    limits: dict[str, KeyLimit] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        name, sep, rest = entry.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"key limit {entry!r}: expected `name:rpm=N,tpm=N`")
        if name in limits:
            raise ValueError(f"key limit for {name!r} given twice")
        values: dict[str, int] = {}
        for part in (p.strip() for p in rest.split(",")):
            field, eq, number = part.partition("=")
            if field not in ("rpm", "tpm") or not eq or not number.isdigit() or int(number) < 1:
                raise ValueError(f"key limit {entry!r}: {part!r} is not rpm=N or tpm=N with N >= 1")
            values[field] = int(number)
        limits[name] = KeyLimit(values.get("rpm"), values.get("tpm"))
    return limits


def limit_for(limits: dict[str, KeyLimit], name: str) -> KeyLimit:
    return limits.get(name) or limits.get(EVERY_KEY) or KeyLimit()
