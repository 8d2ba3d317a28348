"""The operator's dashboard: GET /dashboard (a static page, no build step) and the JSON it
polls, GET /dashboard/data. Open like /metrics: it shows load, never prompts or keys."""

from __future__ import annotations

from router.dashboard.routes import dashboard as dashboard

__all__ = ["dashboard"]
