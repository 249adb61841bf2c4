"""A provider's 404 on an API path, said so that it can be fixed: the path the gateway called and,
when that path has no API version in it, the likely cause (an upstream URL without its /v1).

The tool loop (gateway.engine.run) and the pass-through (gateway.routes.provider_errors) turn such
a 404 into a `PathNotFound`; the app's error middleware logs it once per provider URL
(`log_once`), since every request after the first would say the same.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from aiohttp import web
from yarl import URL

from gateway.errors import GatewayError, UpstreamRefused

log = logging.getLogger("toolspan")

_VERSIONED = re.compile(r"v\d+(?:alpha|beta)?\d*|openai")  # a path segment that names an API surface
SEEN = web.AppKey("provider_paths_seen", set[str])  # the provider URLs whose 404 was logged already


def _unversioned(url: URL) -> bool:
    return not any(_VERSIONED.fullmatch(part) for part in url.parts)


class PathNotFound(UpstreamRefused):
    """The provider answered 404 to the path the gateway called. Its body is the gateway's own
    (never the provider's as it came), with the provider's message kept in it."""

    def __init__(self, refused: UpstreamRefused, method: str, url: str) -> None:
        super().__init__(refused.status, refused.raw_body, {})
        self.headers = refused.headers
        self.as_sent = refused.as_sent
        self.url = URL(url).with_user(None).with_query(None)
        self.method = method
        said = _provider_says(refused)
        hint = ("; the upstream URL usually ends in /v1: set TOOLSPAN_UPSTREAM=https://host/v1"
                if _unversioned(self.url) else "")
        self.message = f"the provider answered 404 to {method} {self.url.path}{said}{hint}"

    def provider_error(self) -> bool:
        return False  # the caller gets the gateway's message, which names the path

    def body(self) -> dict[str, Any]:
        """The provider's error (its type and code: model_not_found, say) with the gateway's message;
        the gateway's own upstream_error when the provider's was not OpenAI-shaped."""
        own = {"message": self.message, "type": "upstream_error", "param": None, "code": "upstream_404"}
        if super().provider_error():
            theirs = json.loads(self.raw_body)["error"]
            return {"error": {**own, **{k: theirs.get(k) for k in ("type", "param", "code") if theirs.get(k)},
                              "message": self.message}}
        return {"error": own}

    def unversioned(self) -> bool:
        return _unversioned(self.url)

    def log_line(self) -> str:
        """The operator's line: the whole URL called, and the upstream to set."""
        base = str(self.url.origin())
        hint = (f"; the upstream URL usually ends in /v1: set TOOLSPAN_UPSTREAM={base}/v1"
                if _unversioned(self.url) else "")
        return f"the provider answered 404 to {self.method} {self.url}{hint}"


def _provider_says(refused: UpstreamRefused) -> str:
    if not refused.provider_error():
        return ""
    detail = refused.body().get("error")
    message = detail.get("message") if isinstance(detail, dict) else None
    return f" ({message[:300]})" if isinstance(message, str) and message else ""


def not_found_at(error: GatewayError, method: str, url: str) -> GatewayError:
    """`error` as a PathNotFound when it is the provider's 404 to `url`; else `error` itself."""
    if isinstance(error, UpstreamRefused) and not isinstance(error, PathNotFound) and error.status == 404:
        return PathNotFound(error, method, url)
    return error


def log_once(app: web.Application, error: GatewayError) -> None:
    """Logs a PathNotFound the first time its URL fails (later requests say the same thing)."""
    if not isinstance(error, PathNotFound) or SEEN not in app:
        return
    key = f"{error.method} {error.url}"
    if key not in app[SEEN]:
        app[SEEN].add(key)
        log.warning("%s", error.log_line())
