"""GET /dashboard, its static files, and GET /dashboard/data."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from router.dashboard.data import snapshot
from router.errors import APIError

STATIC = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}

# the operator's page, not part of the API: left out of /openapi.json
dashboard = APIRouter(tags=["dashboard"], include_in_schema=False)


@dashboard.get("/dashboard")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")


@dashboard.get("/dashboard/static/{name}")
async def static(name: str) -> FileResponse:
    path = STATIC / name
    if "/" in name or path.suffix not in _TYPES or not path.is_file():
        raise APIError(404, f"no dashboard file {name!r}", code="not_found")
    return FileResponse(path, media_type=_TYPES[path.suffix])


@dashboard.get("/dashboard/data")
async def data(request: Request) -> JSONResponse:
    return JSONResponse(await snapshot(request.app.state.router))
