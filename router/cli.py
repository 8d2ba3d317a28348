"""`splitserve router`: run the OpenAI-compatible router (uvicorn + uvloop).

Flags override SPLITSERVE_* environment variables (see cluster.settings.RouterSettings);
prefer SPLITSERVE_API_KEY over --api-key, which other users can see in the process list.
"""

from __future__ import annotations

import argparse
import sys

from cluster.listen import listener
from cluster.log_format import configure_logging
from cluster.settings import RouterSettings, SettingsError, load
from cluster.up_args import TRACE_FLAGS
from models.cli import MODEL_CACHE_HELP, add_model_cache_flag
from router.api.tool_parsers import PARSER_NAMES

_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--host", str, "address to listen on (default 127.0.0.1)"),
    ("--port", int, "port to listen on (default 8000)"),
    ("--redis-url", str, "Redis holding the cluster registry"),
    ("--model", str, "model registry name or HF directory, for the tokenizer"),
    ("--model-cache", str, MODEL_CACHE_HELP),
    ("--served-model-name", str, "the model name clients send (default: the model's name)"),
    ("--api-key", str, "require `Authorization: Bearer KEY` on /v1 (prefer the env var)"),
    ("--api-key-file", str, "accepted API keys, one per line: `name:key` (or a bare key)"),
    ("--usage-admin-keys", str, "key names that may read GET /v1/usage (comma-separated)"),
    ("--key-limits", str, "per key name: `alice:rpm=60,tpm=20000;*:rpm=600`"),
    ("--local-prefill-max-tokens", int, "prompts shorter than this skip the prefill pool"),
    ("--max-model-len", int, "context length (default: the smallest of the nodes')"),
    ("--max-inflight", int, "requests served at once; later ones wait in the queue"),
    ("--max-queued", int, "requests waiting by (priority, arrival) before 429"),
    ("--request-timeout-s", float, "deadline of one request"),
    ("--drain-timeout-s", float, "after SIGTERM: seconds running streams get to finish"),
    *TRACE_FLAGS,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, kind, help_text in _FLAGS:
        parser.add_argument(flag, type=kind, default=None, help=help_text)
    add_model_cache_flag(parser, alias_only=True)
    parser.add_argument("--policy", choices=["round_robin", "least_loaded", "kv_aware"])
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    parser.add_argument(
        "--tool-call-parser",
        choices=PARSER_NAMES,
        help="the format tool calls are read in (default auto: the chat template's)",
    )
    parser.add_argument(
        "--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
        help="LoRA adapters a request's model may name (the nodes' --lora-modules)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    overrides = {flag.lstrip("-").replace("-", "_"): None for flag, _, _ in _FLAGS}
    overrides.update(policy=None, log_level=None, tool_call_parser=None, lora_modules=None)
    try:
        settings = load(RouterSettings, **{k: getattr(args, k, None) for k in overrides})
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        sock = listener(settings.host, settings.port)
    except OSError as exc:
        print(f"cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    import uvicorn

    from router.app import create_app

    config = uvicorn.Config(
        create_app(settings),
        loop="uvloop",
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)),
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0
