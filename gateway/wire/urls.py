"""URLs as an allow list compares them: a request's `server_url` against the operator's. Nothing
here fetches or resolves a name."""

from __future__ import annotations

from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LONGEST = 2048


def comparable_url(url: str) -> str | None:
    """`url` in the one form two URLs of the same endpoint share: the scheme and host in lower
    case, a default port dropped, and one trailing '/' dropped. None for a URL that no allow list
    may match: not http(s), no host, a bad port, or carrying user info, a query, a fragment,
    spaces, control or non-ASCII characters (which a parser might read otherwise than a server)."""
    if len(url) > _LONGEST or any(not "!" <= char <= "~" for char in url) or "?" in url or "#" in url:
        return None
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or "@" in parts.netloc:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if not host:
        return None
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    return f"{scheme}://{netloc}{parts.path.removesuffix('/')}"
