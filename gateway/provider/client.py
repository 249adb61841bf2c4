"""The provider client, Upstream: where a call goes (paths, Azure deployments, query strings), its
headers and key, the engine's JSON and streamed calls on the gateway's own connections, the
pass-through on aiohttp's session, readiness probes, and the end of the waits at shutdown. What
goes wrong is mapped by gateway.provider.errors; a stream is read by gateway.provider.sse."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import aiohttp
import orjson
from multidict import MultiDict
from pydantic import SecretStr

from gateway.errors import BadRequest, GatewayError, UpstreamUnavailable, shutting_down
from gateway.provider.connections import IDLE_SECONDS, Answer, ProviderConnections
from gateway.provider.errors import ProviderErrors, raise_for_status, too_deep
from gateway.provider.route import ProviderRoute, provider_route
from gateway.provider.sse import MAX_JSON_DEPTH, sse_events
from gateway.wire.headers import from_provider
from gateway.wire.json_depth import decoded_nests_deeper

PROVIDER_NAMES: dict[str, str] = {  # gen_ai.provider.name by upstream kind (GenAI semantic conventions)
    "openai": "openai", "azure": "azure.ai.openai", "anthropic": "anthropic", "deepseek": "deepseek", "vllm": "vllm",
    "ollama": "ollama", "compatible": "openai_compatible"}
API_PATHS = {"chat": "chat/completions", "responses": "responses", "messages": "messages"}  # under the base URL
ANTHROPIC_VERSION = "2023-06-01"  # the version Anthropic's API is called with when the caller names none
REACH_TIMEOUT_SECONDS = 2.0  # a readiness probe: its connection (through any proxy, TLS too) and the answer's head
REACH_KEPT_SECONDS = 5.0  # how long its answer holds: probes come every few seconds, from every replica


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
        elif requested.startswith("/openai/deployments/") and api == "chat":
            # The deployment the caller named may be an alias: the model routed to names the provider's.
            path = f"openai/deployments/{_deployment(model)}/chat/completions"
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
        with self._ended_by_shutdown(), ProviderErrors(self._whole_timed_out):
            async with asyncio.timeout(self._timeout):
                response = await self._connections.post(path, _json_headers(headers), orjson.dumps(body),
                                                        self._connect_timeout, resent)
                try:
                    await raise_for_status(response)
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
            raise UpstreamUnavailable(too_deep("its answer", self._max_depth), headers=answer_headers)
        return answer, answer_headers

    @asynccontextmanager
    async def post_stream(self, path: str, body: Mapping[str, Any], headers: Mapping[str, str],
                          resent: Callable[[], None] | None = None) -> AsyncIterator[ProviderStream]:
        """A streamed answer: its headers and an iterator of its decoded SSE events; leaving the
        block closes the connection, which is how a client disconnect cancels the provider's work.
        `resent` as for `post`."""
        with self._ended_by_shutdown(), ProviderErrors("the provider did not start its stream in time"):
            async with asyncio.timeout(self._timeout):  # a free connection, and the answer's head
                response = await self._connections.post(path, _json_headers(headers), orjson.dumps(body),
                                                        self._connect_timeout, resent)
        try:
            with ProviderErrors("the provider did not finish its error answer in time"):
                async with asyncio.timeout(self._timeout):
                    await raise_for_status(response)
            yield ProviderStream(from_provider(response.headers),
                                 sse_events(self._reads(response), self._max_depth))
        finally:
            response.release()

    async def forward(self, method: str, path_qs: str, headers: Mapping[str, str],
                      body: AsyncIterator[bytes] | bytes | None) -> aiohttp.ClientResponse:
        """Send a request unchanged; the caller streams the response back and releases it."""
        with self._ended_by_shutdown(), ProviderErrors("the provider did not answer in time",
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
        broken = ProviderErrors(f"cannot connect (no answer within {REACH_TIMEOUT_SECONDS:g} s)")
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
    managers: those cost several times as much, twice on every provider call (see
    NoInstrumentation in gateway.instrumentation)."""

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


def _json_headers(headers: Mapping[str, str]) -> dict[str, str]:
    # We parse these responses ourselves, so ask for them uncompressed.
    return {**headers, "Accept-Encoding": "identity", "Content-Type": "application/json"}


def _deployment(model: str) -> str:
    """An Azure deployment path segment for `model` (which a caller chooses: `..` would leave the path)."""
    if model in (".", ".."):
        raise BadRequest(f"model {model!r} cannot name an Azure deployment", param="model")
    return quote(model, safe="")
