"""Who may open /ui, and what it shows them: with gateway keys configured, whoever holds one of
them sees that key's own trajectories (every key's, for a key marked `operator`), and nobody else
sees anything.

A script sends the key as on /v1 (`Authorization: Bearer <key>`). A browser cannot, so the page
offers a sign-in form: the key is posted once (never put in a URL, where it would stay in the
history and the access log) and the answer sets a session cookie, HttpOnly and SameSite=Strict,
scoped to /ui. The cookie holds no key: it is an HMAC of a fixed text under the key, so it is the
same in every worker and after a restart, and it stops working when its key is removed."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from aiohttp import web

from gateway.http.browsers import is_own_origin
from gateway.settings.parts import GatewayKey

SESSION_COOKIE = "toolspan_ui"
_SESSION_TEXT = b"toolspan /ui session"
HOME = "/ui"


def session_token(key: str) -> str:
    return hmac.new(key.encode(), _SESSION_TEXT, hashlib.sha256).hexdigest()


def key_name(sent: str, keys: Mapping[str, GatewayKey]) -> str | None:
    """The name of the gateway key `sent` is, if it is one."""
    for name, spec in keys.items():
        if sent and hmac.compare_digest(sent.encode(), spec.key.get_secret_value().encode()):
            return name
    return None


def _session_key_name(cookie: str, keys: Mapping[str, GatewayKey]) -> str | None:
    for name, spec in keys.items():
        if cookie and hmac.compare_digest(cookie.encode(), session_token(spec.key.get_secret_value()).encode()):
            return name
    return None


def signed_in(request: web.Request, keys: Mapping[str, GatewayKey]) -> str | None:
    """The name of the gateway key a request carries, as a bearer token or as the session cookie
    it made."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    name = key_name(token.strip(), keys) if scheme.lower() == "bearer" else None
    return name if name is not None else _session_key_name(request.cookies.get(SESSION_COOKIE, ""), keys)


def shown_key(name: str, keys: Mapping[str, GatewayKey]) -> str | None:
    """Whose trajectories the page shows the holder of key `name`: its own, or (None) every key's
    to the operator's."""
    return None if keys[name].operator else name


def same_origin(request: web.Request) -> bool:
    """A form post from a page of this gateway (or from a client that sends no Origin): another
    site must not sign a browser in, nor out. Stricter than the gateway's Origin check, which
    takes `allowed_origins` too: only the page itself signs in."""
    origin = request.headers.get("Origin")
    return origin is None or is_own_origin(request, origin)


def page_after_sign_in(requested: str | None) -> str:
    """Where to go after signing in: the page asked for, when it is one of ours."""
    if (requested and requested.startswith(HOME) and not requested.startswith("//") and "\\" not in requested
            and all(c.isprintable() and not c.isspace() for c in requested)):  # nothing to split a header
        return requested
    return HOME


def set_session(response: web.StreamResponse, key: str, secure: bool) -> None:
    response.set_cookie(SESSION_COOKIE, session_token(key), path=HOME, httponly=True, samesite="Strict",
                        secure=secure)


def end_session(response: web.StreamResponse) -> None:
    response.del_cookie(SESSION_COOKIE, path=HOME)
