"""Which proxy the environment names for a URL, as curl (7.86 and later) reads it, but for the
uppercase `HTTP_PROXY`.

- `https_proxy` / `HTTPS_PROXY` for an https:// URL, `http_proxy` / `HTTP_PROXY` for an http://
  one, then `all_proxy` / `ALL_PROXY`. The lowercase name wins; an empty value is unset. curl reads
  no `HTTP_PROXY` (a CGI program gets it from a request's `Proxy:` header), but Python's urllib,
  requests, httpx and aiohttp and Go's net/http read it outside CGI, and container platforms set the
  uppercase names; the gateway is no CGI program.
- `no_proxy` / `NO_PROXY`: entries separated by commas (and spaces); `*` alone matches every
  host; a name matches itself and its subdomains, with or without a leading dot, in any case; an
  IP address matches itself and a CIDR range (`10.0.0.0/8`, `::1/128`) the addresses in it. Ports
  are not read, as in curl: an entry with one matches nothing.
- A proxy URL without a scheme is http://; without a port, 1080 (curl's default). Only http://
  proxies are spoken to (CONNECT for https:// upstreams); credentials in the URL go in
  Proxy-Authorization as HTTP Basic.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from yarl import URL

from gateway.wire.escaping import without_credentials

PROXY_VARIABLES = frozenset({"https_proxy", "http_proxy", "all_proxy", "no_proxy"})  # lowercased
DIRECT = "direct"  # the upstream_proxy value for "no proxy, whatever the environment says"
_SEPARATORS = re.compile(r"[,\s]+")


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: where it listens and the Proxy-Authorization value its URL's userinfo makes."""

    host: str
    port: int
    authorization: str | None

    @property
    def url(self) -> URL:
        """Its URL without credentials (they travel in `authorization`)."""
        return URL.build(scheme="http", host=self.host, port=self.port)


def parse_proxy(value: str, source: str) -> Proxy:
    """The proxy `value` names; a ValueError naming `source` (a setting or variable) when it names
    none, which repeats `value` without its credentials."""
    shown = without_credentials(value)
    text = value.strip()
    if "://" not in text:
        text = f"http://{text}"
    try:
        url = URL(text)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"{source}: {shown!r} is not a proxy URL ({without_credentials(str(exc))})") from exc
    if url.scheme != "http":
        raise ValueError(f"{source}: {shown!r}: only http:// proxies are supported (the gateway tunnels https "
                         "through them with CONNECT)")
    if not url.host:
        raise ValueError(f"{source}: {shown!r} names no proxy host; give http://host:port")
    credentials = None
    if url.user is not None:
        credentials = "Basic " + base64.b64encode(f"{url.user}:{url.password or ''}".encode()).decode()
    return Proxy(url.host, port if port is not None and url.explicit_port else 1080, credentials)


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def proxy_for(scheme: str, host: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy the environment names for `scheme`://`host`, or None (none named, or NO_PROXY)."""
    named = _first(environ, f"{scheme}_proxy", f"{scheme.upper()}_PROXY")
    named = named or _first(environ, "all_proxy", "ALL_PROXY")
    if named is None:
        return None
    proxy = parse_proxy(named[1], named[0])
    bypass = _first(environ, "no_proxy", "NO_PROXY")
    if bypass is not None and bypassed(host, bypass[1]):
        return None
    return proxy


def bypassed(host: str, no_proxy: str) -> bool:
    """Whether `host` (a name or an IP address, brackets or not) matches an entry of `no_proxy`."""
    entries = [entry for entry in _SEPARATORS.split(no_proxy.strip()) if entry]
    if entries == ["*"]:
        return True
    host = host.strip("[]").rstrip(".").lower()
    address = _address(host)
    for entry in entries:
        if address is not None:
            if _address_matches(address, entry):
                return True
            continue
        name = entry.lstrip(".").rstrip(".").lower()
        if name and (host == name or host.endswith(f".{name}")):
            return True
    return False


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _address_matches(address: ipaddress.IPv4Address | ipaddress.IPv6Address, entry: str) -> bool:
    try:
        network = ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        return False  # a name, or an entry with a port: not an address entry
    return address.version == network.version and address in network
