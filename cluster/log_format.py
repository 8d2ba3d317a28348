"""The log format every splitserve process writes: key=value lines on stderr."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str) -> None:
    """key=value lines on stderr at `level` (debug, info, warning, error)."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
