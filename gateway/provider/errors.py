"""What goes wrong talking to the provider, as gateway errors: the one mapping of a failed call
(no connection, a timeout, a broken or refused connection), of an answer's error status, and of
an answer nested past the JSON depth limit. Messages never name the provider's address (it is the
operator's business; the log has it)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from gateway.errors import (
    OVERLOADED,
    GatewayError,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
    provider_status,
)
from gateway.provider.http1 import Answer
from gateway.provider.route import ConnectTimeout, ProviderConnectionError, describe
from gateway.wire.headers import from_provider

# Answers that mean "the same request may work later" (529: Anthropic's overloaded_error).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504, OVERLOADED})


class ProviderErrors:
    """Around a call to the provider: what escapes it becomes a gateway error, worded alike on
    every route. `timeout_message` words a timeout of the caller's; `broken` begins the message of
    a connection that failed."""

    def __init__(self, timeout_message: str, broken: str = "could not reach the provider",
                 connect: float | None = None, tls: bool = False) -> None:
        self._timeout_message = timeout_message
        self._broken = broken
        self._connect = connect  # aiohttp's connect timeout, to word its expiry as the pool's
        self._tls = tls  # the provider is spoken to over TLS (a closed connection may be a refusal)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, GatewayError):
            return
        if isinstance(exc, ConnectTimeout):  # no connection: worded alike on every route
            raise UpstreamTimeout(f"{self._broken}: {exc}") from exc
        if isinstance(exc, aiohttp.ConnectionTimeoutError) and self._connect is not None:
            raise UpstreamTimeout(f"{self._broken}: {ConnectTimeout(self._connect)}") from exc
        if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
            raise UpstreamTimeout(self._timeout_message) from exc
        # A broken or refused connection may work the next time; text that is not UTF-8 will not.
        if isinstance(exc, ProviderConnectionError):
            raise UpstreamUnavailable(f"{self._broken}: {exc.description}", retryable=True) from exc
        if isinstance(exc, aiohttp.ClientError | UnicodeDecodeError | asyncio.IncompleteReadError):
            raise UpstreamUnavailable(f"{self._broken}: {describe(exc, self._tls)}",
                                      retryable=not isinstance(exc, UnicodeDecodeError)) from exc


async def raise_for_status(response: aiohttp.ClientResponse | Answer) -> None:
    """Nothing for a success; for a redirect or an error status, the gateway error it maps to."""
    if response.status < 300:
        return
    if response.status < 400:  # redirects are not followed: the key must not travel to another origin
        raise UpstreamUnavailable(f"the provider answered {response.status}, a redirect, which the gateway does "
                                  "not follow", code=f"upstream_{response.status}")
    try:
        body = await response.read()
    except (TimeoutError, aiohttp.ClientError, ProviderConnectionError) as exc:
        raise UpstreamUnavailable(f"the provider answered {response.status} and then broke off",
                                  retryable=response.status in RETRYABLE_STATUSES) from exc
    if response.status < 500:
        raise UpstreamRefused(response.status, body, response.headers)
    raise UpstreamUnavailable(f"the provider answered {response.status}: {provider_message(body)}",
                              code=f"upstream_{response.status}", headers=from_provider(response.headers),
                              status=provider_status(response.status),
                              retryable=response.status in RETRYABLE_STATUSES)


def provider_message(body: bytes) -> str:
    """What a provider's error body says: its OpenAI-shaped message, else the start of its text."""
    try:
        decoded = orjson.loads(body)
    except ValueError:
        decoded = None
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message: str = error["message"]
        return message[:1000]
    text = body.decode("utf-8", "replace").strip()
    return text[:1000] or "(no body)"


def too_deep(what: str, limit: int) -> str:
    """The message for `what` the provider sent nested past the max_json_depth setting."""
    return (f"the provider sent {what} nesting arrays and objects more than {limit} levels deep "
            "(max_json_depth)")
