"""What a web browser may do with the gateway: the checks against cross-site requests and DNS
rebinding that every route goes through, before the caller is resolved.

A page on another site can make a browser send a request to a gateway it can reach (one on
loopback, without keys, say), and a page whose name an attacker re-points at 127.0.0.1 (DNS
rebinding) is even same-origin with it. So:

- `Origin`: a browser names the page behind every cross-origin request and every POST. Unless it
  is the gateway's own origin (the scheme and the Host the request came with) or one of
  `allowed_origins`, the request is refused (403). `Origin: null` (a sandboxed frame, a file) is
  foreign. Clients that are not browsers send no Origin and are not affected.
- `Host`: a rebinding page's requests carry its own name. With `allowed_hosts` set, only those
  names pass; unset, a gateway listening on loopback takes only its address and the localhost
  names, and one listening on any other address takes every Host (compose, load balancers).

The rule is made once from the settings (`browser_rule`); `check_browser` is the per-request part:
two header lookups and, when there is a Host check, a set lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.errors import BadRequest, Forbidden
from gateway.settings.model import Settings

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})  # the `host` settings that mean "this machine only"
# Names that reach this machine without asking DNS: a rebinding page cannot have one of them.
LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]")
LOCAL_SUFFIXES = (".localhost",)  # RFC 6761: every name under localhost is the machine itself
ANY_HOST = "*"
_DEFAULT_PORTS = {"http": ":80", "https": ":443"}
_SHOWN_CHARS = 100  # of a refused header's value, in the error message


@dataclass(frozen=True)
class BrowserRule:
    """The Host names and Origins the gateway answers: `hosts` None takes any Host; a Host also
    passes when its name ends with one of `host_suffixes`."""

    hosts: frozenset[str] | None
    host_suffixes: tuple[str, ...]
    origins: frozenset[str]

    def allows_host(self, host: str) -> bool:
        if self.hosts is None or host.partition(":")[0] in self.hosts:  # the usual Host: no more parsing
            return True
        name = host_name(host)
        return name in self.hosts or name.endswith(self.host_suffixes)


def host_name(host: str) -> str:
    """The name of a Host header's value, without its port, in lower case: "[::1]:8080" -> "[::1]",
    "Localhost.:8080" -> "localhost"."""
    if host.startswith("["):
        end = host.find("]")
        name = host[:end + 1] if end > 0 else host
    else:
        name = host.partition(":")[0]
    return name.rstrip(".").lower()


def host_entry(name: str) -> str:
    """An `allowed_hosts` entry as host_name gives a Host: lower case, an IPv6 address bracketed."""
    name = name.strip().rstrip(".").lower()
    return f"[{name}]" if name.count(":") > 1 and not name.startswith("[") else name


def _without_default_port(scheme: str, authority: str) -> str:
    port = _DEFAULT_PORTS.get(scheme)
    return authority.removesuffix(port) if port is not None else authority


def origin_entry(origin: str) -> str:
    """An origin as a browser writes it in the Origin header: lower case, no default port, no slash."""
    scheme, _, authority = origin.strip().rstrip("/").lower().partition("://")
    return f"{scheme}://{_without_default_port(scheme, authority)}"


def browser_rule(settings: Settings) -> BrowserRule:
    """The rule the settings make: `allowed_hosts` as given ("*": any; ".example.com": it and its
    subdomains), else on a loopback `host` the listening address and the localhost names, else any."""
    origins = frozenset(origin_entry(origin) for origin in settings.allowed_origins)
    if settings.allowed_hosts is not None:
        entries = [host_entry(entry) for entry in settings.allowed_hosts]
        if ANY_HOST in entries:
            return BrowserRule(None, (), origins)
        suffixes = tuple(entry for entry in entries if entry.startswith("."))
        names = {entry for entry in entries if not entry.startswith(".")} | {s[1:] for s in suffixes}
        return BrowserRule(frozenset(names), suffixes, origins)
    if settings.host.lower() in LOOPBACK:
        return BrowserRule(frozenset({host_entry(settings.host), *LOCAL_NAMES}), LOCAL_SUFFIXES, origins)
    return BrowserRule(None, (), origins)


def _shown(value: str) -> str:
    return value[:_SHOWN_CHARS] + ("..." if len(value) > _SHOWN_CHARS else "")


def is_own_origin(request: web.Request, origin: str) -> bool:
    """`origin` is the gateway's own as this request reached it: the same host and port as its
    Host, and its scheme (or the one a proxy in front names in X-Forwarded-Proto: a cross-site page
    cannot set that header without a preflight, and the preflight is refused)."""
    scheme, found, authority = origin.partition("://")
    host = request.headers.get("Host")
    if not found or not scheme or host is None:
        return False
    forwarded = request.headers.get("X-Forwarded-Proto")
    if scheme != request.scheme and (forwarded is None or scheme != forwarded.partition(",")[0].strip().lower()):
        return False
    return _without_default_port(scheme, authority) == _without_default_port(scheme, host.lower())


def check_browser(request: web.Request, rule: BrowserRule) -> None:
    """Refuses a request whose Host the gateway does not answer for, or that a foreign page sent.

    A foreign Host is a 421 Misdirected Request (invalid_request_error), as the MCP SDK answers it:
    the request reached a server that does not serve the site it names, a wrong address rather than
    a want of permission. A foreign Origin is a 403 (permission_error): the gateway serves the
    site, but not to that page."""
    headers = request.headers
    host = headers.get("Host")
    if host is not None and not rule.allows_host(host):
        raise BadRequest(f"the Host header names {_shown(host_name(host))!r}, a name this gateway does not answer "
                         "to (as a DNS-rebinding page's request would); if it is one of the gateway's names, list "
                         "it in allowed_hosts", status=421, code="host_not_allowed")
    origin = headers.get("Origin")
    if origin is not None and origin not in rule.origins and not is_own_origin(request, origin):
        raise Forbidden(f"the request came from a web page at {_shown(origin)!r}, which is neither this gateway's "
                        "own origin nor in allowed_origins", code="origin_not_allowed")
