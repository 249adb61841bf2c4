"""How the gateway reaches its provider: directly or through an HTTP proxy, with which TLS, and
what a failure on the way is called. The engine's connection pool (gateway.provider.connections), the
pass-through's aiohttp session and the readiness probe all take their route from one ProviderRoute,
so a proxy, a CA bundle or a client certificate applies to every one of them, and the same
failure reads the same on each.

The proxy is decided once, for the provider's one origin: the `upstream_proxy` setting when set
("direct": none), else the environment as curl reads it (gateway.provider.proxies).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp
from yarl import URL

from gateway.provider.proxies import DIRECT, Proxy, parse_proxy, proxy_for

P = TypeVar("P", bound=asyncio.BaseProtocol)
_MAX_PROXY_HEAD = 16 * 1024  # a proxy's answer to CONNECT, its headers: past this it is not a proxy


class ProviderConnectionError(Exception):
    """The provider's connection failed; `description` says how, without its address (which is
    the operator's business and in the log)."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class ConnectTimeout(TimeoutError):
    """No connection to the provider (or its proxy) within the connect timeout."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"cannot connect (no connection within {seconds:g} s)")
        self.seconds = seconds


class ProxyRefused(ProviderConnectionError):
    """The proxy refused the gateway: its answer to CONNECT was not 200, or a forwarding proxy
    answered 407 (which only a proxy sends) in place of the provider."""

    def __init__(self, status: int) -> None:
        super().__init__(_proxy_status(status))
        self.status = status


def _proxy_status(status: int) -> str:
    """One wording per refusal, the same whether the proxy tunnels (CONNECT) or forwards."""
    if status in (401, 407):  # tinyproxy answers wrong credentials with 401, as not every proxy does
        return (f"the proxy refused to connect to the provider ({status}: it wants credentials, or not these: give "
                "them in the proxy URL as http://user:password@host:port)")
    if status == 403:
        return "the proxy refused to connect to the provider (403: it does not allow this destination)"
    return f"the proxy could not open a tunnel to the provider (it answered {status})"


@dataclass(frozen=True)
class ProviderRoute:
    """The route to the provider at `base_url`: `proxy` (None: direct) and, for https, `tls`."""

    base_url: URL
    proxy: Proxy | None
    tls: ssl.SSLContext | None

    @property
    def host(self) -> str:
        assert self.base_url.host is not None  # checked by provider_route
        return self.base_url.host

    @property
    def port(self) -> int:
        return self.base_url.port or (443 if self.base_url.scheme == "https" else 80)

    @property
    def forwards(self) -> bool:
        """Requests go to an HTTP proxy in absolute form (an http:// provider behind a proxy)."""
        return self.proxy is not None and self.tls is None

    def request_target(self, target: str) -> str:
        """A request line's target: as it is, or in absolute form for a forwarding proxy."""
        return f"{self.base_url.origin()}{target}" if self.forwards else target

    def proxy_head(self) -> str:
        """The header lines a forwarding proxy gets on every request (its credentials)."""
        return "".join(f"{name}: {value}\r\n" for name, value in self.forward_headers().items())

    def session_proxy(self) -> tuple[URL | None, dict[str, str] | None]:
        """aiohttp's `proxy` and `proxy_headers` for the same route (its connector takes `tls`).
        aiohttp sends `proxy_headers` only with CONNECT: a forwarding proxy's credentials go in
        each request's own headers (`proxy_head`, as a mapping, `forward_headers`)."""
        if self.proxy is None:
            return None, None
        headers = {"Proxy-Authorization": self.proxy.authorization} if self.proxy.authorization else None
        return self.proxy.url, headers

    def forward_headers(self) -> dict[str, str]:
        """The headers a forwarding proxy gets on every request (its credentials)."""
        if not self.forwards or self.proxy is None or self.proxy.authorization is None:
            return {}
        return {"Proxy-Authorization": self.proxy.authorization}

    def refusal(self, status: int) -> ProxyRefused | None:
        """The proxy's refusal, when an answer's `status` is one: a forwarding proxy's 407 (a
        provider's 401 and 403 cannot be told from a proxy's, and stay the provider's)."""
        return ProxyRefused(status) if self.forwards and status == 407 else None

    def connector(self, limit: int, keepalive_timeout: float) -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(limit=limit, keepalive_timeout=keepalive_timeout,
                                    ssl=self.tls if self.tls is not None else True)

    async def open(self, factory: Callable[[], P], within: float) -> P:
        """A connection to the provider (TLS included, for https) within `within` seconds, as the
        route says: to the provider, to the forwarding proxy, or through the proxy's tunnel."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(within):
                if self.proxy is None or self.forwards:
                    host, port = (self.host, self.port) if self.proxy is None else (self.proxy.host, self.proxy.port)
                    try:
                        _, protocol = await loop.create_connection(
                            factory, host, port, ssl=self.tls,
                            server_hostname=self.host if self.tls is not None else None)
                    except OSError as exc:
                        raise describe_error(exc, to_proxy=self.proxy is not None) from exc
                    return protocol
                sock = await self._tunnel()
                try:
                    _, protocol = await loop.create_connection(factory, sock=sock, ssl=self.tls,
                                                               server_hostname=self.host)
                except BaseException as exc:
                    sock.close()
                    if isinstance(exc, OSError):
                        raise describe_error(exc) from exc
                    raise
                return protocol
        except TimeoutError as exc:
            if isinstance(exc, ConnectTimeout):
                raise
            raise ConnectTimeout(within) from exc

    async def _tunnel(self) -> socket.socket:
        """A socket to the proxy on which it answered 200 to CONNECT host:port."""
        assert self.proxy is not None
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self.proxy.host, self.proxy.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise describe_error(exc, to_proxy=True) from exc
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            try:
                await loop.sock_connect(sock, address)
            except OSError as exc:
                raise describe_error(exc, to_proxy=True) from exc
            authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
            auth = f"Proxy-Authorization: {self.proxy.authorization}\r\n" if self.proxy.authorization else ""
            await loop.sock_sendall(sock, f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n".encode())
            status = await _proxy_answer(loop, sock)
        except BaseException:
            sock.close()
            raise
        if status != 200:
            sock.close()
            raise ProxyRefused(status)
        return sock


async def _proxy_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> int:
    """The status of the proxy's answer to CONNECT, its head read whole. Nothing follows a 200
    until the client speaks (TLS's client hello comes first), so nothing of the tunnel is read."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = await loop.sock_recv(sock, 4096)
        if not data:
            raise ProviderConnectionError("the proxy closed the connection")
        head += data
        if len(head) > _MAX_PROXY_HEAD:
            raise ProviderConnectionError("the proxy's answer is not HTTP")
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ProviderConnectionError("the proxy's answer is not HTTP")
    return int(parts[1])


def provider_route(base_url: str, proxy: str | None, ca_bundle: Path | None, client_cert: Path | None,
                   client_key: Path | None, environ: Mapping[str, str]) -> ProviderRoute:
    """The route to `base_url`. `proxy` is the upstream_proxy setting (None: the environment's;
    "direct": none); `environ` holds the proxy variables. A bad value is a ValueError naming it."""
    url = URL(base_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"the provider's URL must be http(s)://host...: {base_url}")
    if proxy is not None:
        chosen = None if proxy.strip().lower() == DIRECT else parse_proxy(proxy, "upstream_proxy")
    else:
        chosen = proxy_for(url.scheme, url.host, environ)
    tls = tls_context(ca_bundle, client_cert, client_key) if url.scheme == "https" else None
    return ProviderRoute(url, chosen, tls)


def tls_context(ca_bundle: Path | None, client_cert: Path | None, client_key: Path | None) -> ssl.SSLContext:
    """The TLS the provider is spoken to with: the system's CAs, or only `ca_bundle`'s (as curl's
    --cacert), and a client certificate when given."""
    try:
        context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"upstream_ca_bundle {ca_bundle}: not a readable PEM file of CA certificates ({exc})") from exc
    if client_cert is not None:
        try:
            context.load_cert_chain(str(client_cert), str(client_key) if client_key is not None else None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"upstream_client_cert {client_cert}"
                             f"{f' with upstream_client_key {client_key}' if client_key else ''}: not a readable "
                             f"PEM certificate and its private key ({exc})") from exc
    return context


_CLIENT_CERT_ALERTS = frozenset({"TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE",
                                 "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "TLSV1_ALERT_UNKNOWN_CA",
                                 "SSLV3_ALERT_CERTIFICATE_EXPIRED", "TLSV1_ALERT_ACCESS_DENIED"})


def describe(exc: BaseException, tls: bool = False) -> str:
    """The one wording of a failure to reach the provider, whichever client met it (aiohttp's
    errors are unwrapped to the OS or TLS error beneath), without the provider's address."""
    if isinstance(exc, ProviderConnectionError):
        return exc.description
    if isinstance(exc, ConnectTimeout):
        return str(exc)
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return _proxy_status(exc.status)
    to_proxy = isinstance(exc, aiohttp.ClientProxyConnectionError)
    inner = _beneath(exc)
    if isinstance(inner, OSError) and not (inner is exc and isinstance(exc, aiohttp.ClientOSError)):
        return describe_error(inner, to_proxy).description
    if isinstance(exc, aiohttp.ClientOSError):  # on a connection made: what happened, not its address
        return os.strerror(exc.errno) if exc.errno and exc.errno > 0 else type(exc).__name__
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return closed_before_answering(tls).description
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "its answer broke off"
    if isinstance(exc, aiohttp.ClientError):
        return type(exc).__name__
    return str(exc) or type(exc).__name__


def _beneath(exc: BaseException) -> BaseException:
    """The OS or TLS error an aiohttp error wraps, if any."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return exc.certificate_error
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.os_error
    seen = exc
    while seen.__cause__ is not None and not isinstance(seen, ssl.SSLError):
        seen = seen.__cause__
    return seen if isinstance(seen, ssl.SSLError) else exc


def closed_before_answering(tls: bool) -> ProviderConnectionError:
    """A connection the provider closed before its answer began. Over TLS 1.3 that is also how a
    provider refuses a missing or unknown client certificate (the handshake has completed on the
    gateway's side when the refusal comes), so the hint names the setting, as a possibility."""
    if not tls:
        return ProviderConnectionError("the provider closed the connection")
    return ProviderConnectionError(
        "the provider closed the connection before answering (a provider that requires a client certificate "
        "does so to one without it, or with one it does not accept: see upstream_client_cert)")


def describe_error(exc: OSError, to_proxy: bool = False) -> ProviderConnectionError:
    """An OS or TLS error of a connection to the provider (or to its proxy), as worded everywhere."""
    where = "cannot connect to the proxy" if to_proxy else "cannot connect"
    if isinstance(exc, socket.gaierror):
        return ProviderConnectionError(f"{where} (the host name does not resolve)")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return ProviderConnectionError(
            f"cannot connect (TLS: CERTIFICATE_VERIFY_FAILED: {exc.verify_message or exc.reason}; the provider's "
            "certificate is not signed by a trusted CA: upstream_ca_bundle names the CAs to trust)")
    if isinstance(exc, ssl.SSLError):
        if exc.reason in _CLIENT_CERT_ALERTS:
            return ProviderConnectionError(
                f"cannot connect (TLS: the provider refused the gateway's client certificate, or wants one: "
                f"{exc.reason}; see upstream_client_cert)")
        return ProviderConnectionError(f"cannot connect (TLS: {exc.reason or type(exc).__name__})")
    reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else type(exc).__name__
    return ProviderConnectionError(f"{where} ({reason})")
