"""`GET /`: where to go from here, rather than a bare 404. A browser gets a short page of links,
anything else JSON with the same links (only the surfaces this gateway serves)."""

from __future__ import annotations

from aiohttp import web

from gateway.http.keys import SETTINGS

TITLE = "toolspan: an OpenAI-compatible gateway that runs tools"


def _links(request: web.Request) -> dict[str, str]:
    settings = request.app[SETTINGS]
    links = {"api": "/v1", "tools": "/v1/tools"}
    if settings.ui:
        links["page"] = "/ui"
    if settings.mcp_endpoint:
        links["mcp"] = "/mcp"
    links.update({"metrics": "/metrics", "health": "/healthz", "ready": "/readyz", "openapi": "/openapi.json"})
    return links


def _wants_html(request: web.Request) -> bool:
    """A browser asks for text/html first; an API client asks for JSON or anything (*/*)."""
    accept = request.headers.get("Accept", "")
    return "text/html" in accept.split(",")[0]


async def index(request: web.Request) -> web.Response:
    links = _links(request)
    if not _wants_html(request):
        return web.json_response({"name": "toolspan", "description": TITLE.partition(": ")[2],
                                  "base_url": "/v1", "links": links})
    items = "".join(f'<li><a href="{path}">{path}</a> ({name})</li>' for name, path in links.items())
    page = (f"<!doctype html><html lang=en><meta charset=utf-8><title>toolspan</title>"
            f"<h1>{TITLE}</h1><p>Point an OpenAI client at <code>/v1</code> of this address.</p><ul>{items}</ul>")
    return web.Response(text=page, content_type="text/html")
