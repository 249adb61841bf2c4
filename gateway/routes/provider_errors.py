"""A provider's error answer on the pass-through, in OpenAI's shape as every gateway error is: an
OpenAI-shaped 4xx goes on byte for byte; any other 4xx (text, HTML, an empty body, JSON of
another shape) is wrapped with the provider's text in its message; a 5xx is a 502 (Anthropic's 529
stays a 529, gateway.errors.provider_status) that keeps the provider's message; a 404 at a base
URL with no /v1 names the path called and the likely fix (gateway.provider.paths). The same
mapping as the tool loop's own provider calls (gateway.provider.errors.raise_for_status,
gateway.errors.UpstreamRefused)."""

from __future__ import annotations

import zlib

import aiohttp
from aiohttp import web

from gateway.errors import UpstreamRefused, UpstreamUnavailable, provider_status
from gateway.provider.errors import provider_message
from gateway.provider.paths import PathNotFound, not_found_at
from gateway.wire.headers import from_provider

# An error body is read whole to be judged, so its read is capped: an OpenAI error is a few hundred
# bytes, and of any other body only the start goes in the message.
MAX_ERROR_BYTES = 64 * 1024
_ZLIB_MODES = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


async def _read_capped(answer: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """Up to MAX_ERROR_BYTES of the body, and whether that is all of it. A body that breaks off is
    judged by what came."""
    parts: list[bytes] = []
    size = 0
    try:
        async for data in answer.content.iter_any():
            parts.append(data)
            size += len(data)
            if size > MAX_ERROR_BYTES:
                return b"".join(parts)[:MAX_ERROR_BYTES], False
    except (aiohttp.ClientError, TimeoutError):
        return b"".join(parts), False
    return b"".join(parts), True


def _decoded(raw: bytes, encoding: str) -> bytes:
    """The body's text under its Content-Encoding (the pass-through leaves bodies encoded), at most
    MAX_ERROR_BYTES of it; a line saying so when it cannot be decoded."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    mode = _ZLIB_MODES.get(encoding)
    if mode is not None:
        try:
            return zlib.decompressobj(mode).decompress(raw, MAX_ERROR_BYTES)
        except zlib.error:
            if encoding == "deflate":  # some servers send deflate without its zlib header
                try:
                    return zlib.decompressobj(-zlib.MAX_WBITS).decompress(raw, MAX_ERROR_BYTES)
                except zlib.error:
                    pass
    return f"(a body in the {encoding[:40]!r} encoding, which the gateway does not read)".encode()


async def provider_error(answer: aiohttp.ClientResponse) -> web.Response:
    """The answer to a provider's 4xx/5xx (`answer`, not yet read): an OpenAI-shaped 4xx as it
    came (headers and encoding too); else raises the OpenAI-shaped error it stands for."""
    raw, whole = await _read_capped(answer)
    text = _decoded(raw, answer.headers.get("Content-Encoding", ""))
    if answer.status >= 500:
        raise UpstreamUnavailable(f"the provider answered {answer.status}: {provider_message(text)}",
                                  code=f"upstream_{answer.status}", headers=from_provider(answer.headers),
                                  status=provider_status(answer.status))
    refused = UpstreamRefused(answer.status, text, answer.headers)  # wraps what is not OpenAI-shaped
    missing = not_found_at(refused, answer.method, str(answer.url))
    if isinstance(missing, PathNotFound) and missing.unversioned():
        # A route the provider does not have, at a base URL without its /v1: most likely that URL is
        # wrong. Said with the path called and the fix (a 404 at a /v1 path, such as an unknown
        # model or file, goes on as it came).
        raise missing
    if whole and refused.provider_error():  # as it came: headers and encoding too
        return web.Response(status=answer.status, reason=answer.reason, body=raw, headers=refused.as_sent)
    raise refused
