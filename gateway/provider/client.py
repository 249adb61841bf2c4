"""The provider client: one ClientSession, error mapping, and SSE reading."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import aiohttp
import orjson
from multidict import MultiDict
from pydantic import SecretStr

from gateway.errors import (
    OVERLOADED,
    BadRequest,
    GatewayError,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
    provider_status,
    shutting_down,
    stream_error,
)
from gateway.provider.connections import IDLE_SECONDS, Answer, ProviderConnectionError, ProviderConnections
from gateway.provider.route import ConnectTimeout, ProviderRoute, describe, provider_route
from gateway.wire.headers import from_provider
from gateway.wire.json_depth import decoded_nests_deeper, nests_deeper

PROVIDER_NAMES: dict[str, str] = {  # gen_ai.provider.name by upstream kind (GenAI semantic conventions)
    "openai": "openai", "azure": "azure.ai.openai", "anthropic": "anthropic", "deepseek": "deepseek", "vllm": "vllm",
    "ollama": "ollama", "compatible": "openai_compatible"}
API_PATHS = {"chat": "chat/completions", "responses": "responses", "messages": "messages"}  # under the base URL
ANTHROPIC_VERSION = "2023-06-01"  # the version Anthropic's API is called with when the caller names none
# Answers that mean "the same request may work later" (529: Anthropic's overloaded_error).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504, OVERLOADED})
REACH_TIMEOUT_SECONDS = 2.0  # a readiness probe: its connection (through any proxy, TLS too) and the answer's head
REACH_KEPT_SECONDS = 5.0  # how long its answer holds: probes come every few seconds, from every replica
MAX_JSON_DEPTH = 64  # the default of the max_json_depth setting


@dataclass(frozen=True)
class ProviderStream:
    """A streamed answer under way: its headers, and its decoded events."""

    headers: Mapping[str, str]
    events: AsyncIterator[dict[str, Any]]


class Upstream:
    """Talks to the provider: an OpenAI-compatible API under `base_url` (which ends in /v1), or an
    Azure OpenAI resource (`base_url` is its endpoint; deployments by model name, `api-version`,
    the `api-key` header)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: SecretStr | None,
                 timeout_seconds: float, connect_timeout_seconds: float, kind: str = "openai",
                 azure_api_version: str = "2024-10-21", max_connections: int = 100,
                 idle_seconds: float = IDLE_SECONDS, max_json_depth: int = MAX_JSON_DEPTH,
                 route: ProviderRoute | None = None) -> None:
        if api_key is not None and ("\n" in api_key.get_secret_value() or "\r" in api_key.get_secret_value()):
            raise ValueError("the provider API key holds a line break: it cannot go in a header")
        self.session = session  # requests passed on as they are, and readiness probes
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        self._api_key = api_key
        self._azure_api_version = azure_api_version
        self._route = route or provider_route(self.base_url, "direct", None, None, None, {})
        # The engine's own calls, on connections of the gateway's own (see gateway.provider.connections).
        self._connections = ProviderConnections(self.base_url, max_connections, idle_seconds, self._route)
        # The pass-through's route is the same one, its proxy arguments made once (the session's
        # connector has its TLS).
        self._proxy, self._proxy_headers = self._route.session_proxy()
        self._forward_headers = self._route.forward_headers()
        self._max_depth = max_json_depth  # of what the provider sends, as of a request (see _decoded)
        self._timeout = timeout_seconds  # a whole answer; a stream's start, and each gap in it
        self._connect_timeout = connect_timeout_seconds
        self._whole_timed_out = f"the provider did not answer within {timeout_seconds:g} s"
        # A stream may run long; what must not stall is the gap between two chunks, nor the wait for
        # a connection (`connect`: a free one from the bounded pool, and the connect itself).
        self._streaming = aiohttp.ClientTimeout(total=None, connect=timeout_seconds, sock_read=timeout_seconds,
                                                sock_connect=connect_timeout_seconds)
        self.ending = False  # the gateway is shutting down: calls fail with a 503
        self._waiting: set[asyncio.Task[Any]] = set()  # tasks waiting on the provider right now
        self._reached: tuple[float, str | None] | None = None  # when reach() last looked, and why it failed

    @property
    def with_own_key(self) -> bool:
        """The gateway calls the provider with its own key, not the caller's credentials."""
        return self._api_key is not None

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def path(self, api: str, model: str, query: str, requested: str = "") -> str:
        """Where a call of a wire API goes, with the caller's query string. To an Azure resource:
        the surface the caller addressed (`requested`, an /openai/... path), else the deployment of
        the model (Chat) or the v1 surface (Responses)."""
        if self.kind != "azure" or api == "messages":
            path = API_PATHS[api]
        elif requested.startswith("/openai/"):
            path = requested.removeprefix("/")
        elif api == "chat":
            path = f"openai/deployments/{_deployment(model)}/chat/completions"
        else:
            path = "openai/v1/responses"  # the model (deployment) goes in the body
        return self._with_query(path, query)

    def forward_path(self, path_qs: str) -> str | None:
        """Where a request passed on as it is goes (None: nowhere): /v1/... under the base URL, and
        for an Azure resource /v1/... on its v1 surface and /openai/... as addressed."""
        if self.kind == "azure":
            path, _, query = path_qs.partition("?")
            path = path.removeprefix("/") if path.startswith("/openai/") else f"openai{path}"
            return self._with_query(path, query)
        return path_qs.removeprefix("/v1") if path_qs.startswith("/v1/") else None

    def _with_query(self, path: str, query: str) -> str:
        """`path` with the caller's query; the dated Azure surfaces need an api-version, which the
        settings give when the caller sent none."""
        if self.kind == "azure" and (path.startswith("openai/deployments/") or path == "openai/responses"):
            params = MultiDict(parse_qsl(query, keep_blank_values=True))
            if "api-version" not in params:
                params["api-version"] = self._azure_api_version
                query = urlencode(list(params.items()))
        return f"{path}?{query}" if query else path

    def headers(self, caller_headers: Mapping[str, str]) -> dict[str, str]:
        """A provider call's headers: what the caller sent for the provider, and the gateway's own
        key when it has one (then the caller's credentials were left out: see gateway.wire.headers). To
        Anthropic, the key goes as `x-api-key`, and an `anthropic-version` when the caller named none."""
        headers = dict(caller_headers)
        if self.kind == "anthropic" and not any(name.lower() == "anthropic-version" for name in headers):
            headers["anthropic-version"] = ANTHROPIC_VERSION
        if self._api_key is None:
            return headers
        key = self._api_key.get_secret_value()
        own = {"api-key": key} if self.kind == "azure" else {"x-api-key": key} if self.kind == "anthropic" else {
            "Authorization": f"Bearer {key}"}
        return {**headers, **own}

    async def post(self, path: str, body: Mapping[str, Any], headers: Mapping[str, str],
                   resent: Callable[[], None] | None = None) -> tuple[Any, dict[str, str]]:
        """One JSON request: the decoded JSON answer (the engine checks its shape) and the headers
        that may reach the caller. `resent` is told of a resend on a new connection
        (ProviderConnections.post)."""
        with self._ended_by_shutdown(), _ProviderErrors(self._whole_timed_out):
            async with asyncio.timeout(self._timeout):
                response = await self._connections.post(path, _json_headers(headers), orjson.dumps(body),
                                                        self._connect_timeout, resent)
                try:
                    await _raise_for_status(response)
                    raw = await response.read()
                finally:
                    response.release()
        answer_headers = from_provider(response.headers)
        try:
            answer = orjson.loads(raw)
        except ValueError as exc:
            raise UpstreamUnavailable("the provider sent a response that is not JSON",
                                      headers=answer_headers) from exc
        if decoded_nests_deeper(raw, answer, self._max_depth):
            raise UpstreamUnavailable(_too_deep("its answer", self._max_depth), headers=answer_headers)
        return answer, answer_headers

    @asynccontextmanager
    async def post_stream(self, path: str, body: Mapping[str, Any], headers: Mapping[str, str],
                          resent: Callable[[], None] | None = None) -> AsyncIterator[ProviderStream]:
        """A streamed answer: its headers and an iterator of its decoded SSE events; leaving the
        block closes the connection, which is how a client disconnect cancels the provider's work.
        `resent` as for `post`."""
        with self._ended_by_shutdown(), _ProviderErrors("the provider did not start its stream in time"):
            async with asyncio.timeout(self._timeout):  # a free connection, and the answer's head
                response = await self._connections.post(path, _json_headers(headers), orjson.dumps(body),
                                                        self._connect_timeout, resent)
        try:
            with _ProviderErrors("the provider did not finish its error answer in time"):
                async with asyncio.timeout(self._timeout):
                    await _raise_for_status(response)
            yield ProviderStream(from_provider(response.headers),
                                 sse_events(self._reads(response), self._max_depth))
        finally:
            response.release()

    async def forward(self, method: str, path_qs: str, headers: Mapping[str, str],
                      body: AsyncIterator[bytes] | bytes | None) -> aiohttp.ClientResponse:
        """Send a request unchanged; the caller streams the response back and releases it."""
        with self._ended_by_shutdown(), _ProviderErrors("the provider did not answer in time",
                                                        connect=self._connect_timeout,
                                                        tls=self._route.tls is not None):
            response = await self.session.request(method, self.url(path_qs),
                                                  headers={**headers, **self._forward_headers}, data=body,
                                                  timeout=self._streaming, allow_redirects=False,
                                                  auto_decompress=False, proxy=self._proxy,
                                                  proxy_headers=self._proxy_headers)
            if (refusal := self._route.refusal(response.status)) is not None:
                response.release()
                raise refusal  # the proxy's answer, not the provider's: worded as on the other routes
            return response

    async def reachable(self) -> bool:
        return await self.reach() is None

    async def reach(self) -> str | None:
        """Why the provider cannot be reached (None: it can), for readiness probes: a HEAD of the
        base URL on a new connection of the engine's route (its proxy and TLS, the client
        certificate's acceptance included), with no key, within REACH_TIMEOUT_SECONDS. Any answer
        from the provider will do; through a forwarding proxy, its 500 and 502-504 say the provider was not
        reached. The answer is kept for REACH_KEPT_SECONDS."""
        now = time.monotonic()
        if self._reached is not None and now - self._reached[0] < REACH_KEPT_SECONDS:
            return self._reached[1]
        reason = await self._probe()
        self._reached = (time.monotonic(), reason)
        return reason

    async def _probe(self) -> str | None:
        broken = _ProviderErrors(f"cannot connect (no answer within {REACH_TIMEOUT_SECONDS:g} s)")
        try:
            with broken:
                status = await self._connections.probe(REACH_TIMEOUT_SECONDS)
        except GatewayError as exc:
            return exc.message
        if self._route.forwards and status in (500, 502, 503, 504):
            return f"could not reach the provider: the proxy could not connect to it (it answered {status})"
        return None

    def end(self) -> None:
        """The gateway is shutting down: the waits on the provider under way end now, and new
        calls at once, in a 503 (a stream: an error event). Work elsewhere (a tool) runs on."""
        self.ending = True
        for task in self._waiting:
            task.cancel()

    def _ended_by_shutdown(self) -> _EndedByShutdown:
        """Around a wait on the provider: end() cancels it, and that becomes a ShuttingDown error,
        which the request's answer can carry."""
        return _EndedByShutdown(self)

    async def aclose(self) -> None:
        """Closes the engine's connections (the session is its owner's to close)."""
        await self._connections.close()

    async def _reads(self, response: Answer) -> AsyncIterator[bytes]:
        """A streamed answer's reads, each one a wait that the shutdown may end (not what happens
        between them: the rendering of what was read), and that may not stall longer than the
        provider timeout (the answer bounds each of its waits: Answer.chunks)."""
        reads = response.chunks(self._timeout)
        while True:
            with self._ended_by_shutdown():
                data = await anext(reads, b"")
            if not data:
                return
            yield data


class _EndedByShutdown:
    """Upstream._ended_by_shutdown's scope. These scopes are classes, not generator-based context
    managers: those cost three times as much, twice on every provider call (see NoInstrumentation
    in gateway.instrumentation for the measurement)."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> None:
        if self._upstream.ending:
            raise shutting_down()
        self._task = asyncio.current_task()
        assert self._task is not None
        self._upstream._waiting.add(self._task)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        assert self._task is not None
        self._upstream._waiting.discard(self._task)
        if isinstance(exc, asyncio.CancelledError) and self._upstream.ending:
            self._task.uncancel()
            raise shutting_down() from None


class _ProviderErrors:
    """The one mapping of what goes wrong talking to the provider to gateway errors. Messages
    never name the provider's address (it is the operator's business; the log has it)."""

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


def _json_headers(headers: Mapping[str, str]) -> dict[str, str]:
    # We parse these responses ourselves, so ask for them uncompressed.
    return {**headers, "Accept-Encoding": "identity", "Content-Type": "application/json"}


async def _raise_for_status(response: aiohttp.ClientResponse | Answer) -> None:
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


def _deployment(model: str) -> str:
    """An Azure deployment path segment for `model` (which a caller chooses: `..` would leave the path)."""
    if model in (".", ".."):
        raise BadRequest(f"model {model!r} cannot name an Azure deployment", param="model")
    return quote(model, safe="")


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


MAX_EVENT_BYTES = 16 * 1024 * 1024  # one SSE event; a provider may send a whole tool call in one
_TOO_BIG = "the provider's stream holds an event larger than 16 MiB"


async def _lines(reads: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The stream's lines, however long (aiohttp's own line reader stops at 128 KiB). Each read is
    searched once, and a line is joined once from the reads it spans: the work is linear in the
    bytes read whatever their size (searching all that is pending on every read made a large event
    cost the square of its size in small reads, on the event loop: see bench/sse_reader.py)."""
    parts: list[bytes] = []  # the reads (or their ends) of a line not yet complete
    pending = 0  # their length
    async for data in reads:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if parts:
                yield b"".join((*parts, data[start:end]))
                parts, pending = [], 0
            else:
                yield data[start:end]
            start = end + 1
        if start < len(data):
            parts.append(data[start:] if start else data)
            pending += len(data) - start
            if pending > MAX_EVENT_BYTES:
                raise UpstreamUnavailable(_TOO_BIG)
    if parts:
        yield b"".join(parts)


async def sse_events(reads: AsyncIterable[bytes], max_depth: int = MAX_JSON_DEPTH) -> AsyncIterator[dict[str, Any]]:
    """Decoded `data:` payloads of an SSE stream, given as the reads of its connection, up to
    `[DONE]` or the end of the stream (the engine checks that the answer was complete). A stream
    that breaks, holds something other than JSON objects, an event larger than MAX_EVENT_BYTES or
    nested deeper than `max_depth`, or carries an error object raises UpstreamUnavailable."""
    # Data lines are kept as views of the lines read and joined once (orjson reads bytes, and
    # checks their UTF-8): a 15 MiB event is copied once on its way to the decoder, not four times.
    data: list[memoryview] = []
    size = 0  # of the event's data so far: its lines may each be short and together unbounded
    with _ProviderErrors("the provider's stream stalled", "the provider's stream broke"):
        async for raw_line in _lines(reads):
            line = memoryview(raw_line)[:-1] if raw_line.endswith(b"\r") else memoryview(raw_line)
            if raw_line.startswith(b"data:"):
                data.append(line[6:] if raw_line.startswith(b"data: ") else line[5:])
                size += len(raw_line)
                if size > MAX_EVENT_BYTES:
                    raise UpstreamUnavailable(_TOO_BIG)
                continue
            if line or not data:
                continue  # comments, other fields (event:), or blank lines between events
            payload, data, size = _joined(data), [], 0
            if payload == b"[DONE]":
                return
            yield _decode_event(payload, max_depth)
    if data and (payload := _joined(data)) != b"[DONE]":
        yield _decode_event(payload, max_depth)  # a last event without its blank line


def _joined(data: list[memoryview]) -> memoryview | bytes:
    return data[0] if len(data) == 1 else b"\n".join(data)


def _decode_event(payload: memoryview | bytes, max_depth: int) -> dict[str, Any]:
    try:
        event = orjson.loads(payload)
    except ValueError as exc:
        raise UpstreamUnavailable("the provider's stream holds an event that is not JSON") from exc
    if not isinstance(event, dict):
        raise UpstreamUnavailable("the provider's stream holds an event that is not a JSON object")
    if nests_deeper(event, max_depth):
        raise UpstreamUnavailable(_too_deep("an event of its stream", max_depth))
    if isinstance(event.get("error"), dict):
        raise stream_error(event["error"])
    answer: dict[str, Any] = event
    return answer


def _too_deep(what: str, limit: int) -> str:
    return (f"the provider sent {what} nesting arrays and objects more than {limit} levels deep "
            "(max_json_depth)")
