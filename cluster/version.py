"""The package's version, as `splitserve --version` and GET /version report it."""

from __future__ import annotations

import platform
from importlib import metadata


def version() -> str:
    """The installed package's version ("unknown" when run from a source tree only)."""
    try:
        return metadata.version("splitserve")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_info() -> dict[str, str]:
    """What GET /version answers: the package's version, its wire protocol's version and the
    Python running it."""
    from cluster.protocol import PROTOCOL_VERSION

    protocol = str(PROTOCOL_VERSION)
    return {"version": version(), "protocol_version": protocol, "python": platform.python_version()}
