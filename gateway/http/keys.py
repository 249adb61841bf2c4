"""Typed keys for what lives on the app, on each request and on each response (no module-level
state). Data flows down: the app's parts are set up once, the request's by the middleware before
the handler runs; a response carries what its handler reports back."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from gateway.caller import Caller
from gateway.engine import Engine
from gateway.engine.plan import Offering
from gateway.http.browsers import BrowserRule
from gateway.http.metrics_page import MetricsPage
from gateway.instrumentation import Instrumentation, RequestRecord, RequestTrace
from gateway.limits import Limiter
from gateway.mcp.declared import DeclaredServers
from gateway.mcp.server import McpEndpoint
from gateway.mcp.sources import McpSources
from gateway.provider.upstreams import Upstreams
from gateway.settings.model import Settings
from gateway.state import StateStore
from gateway.tools import ToolExecutor, ToolRegistry
from gateway.tools.approval_gate import Approvals
from gateway.wire.headers import SecretNames


@dataclass(frozen=True)
class LoopParts:
    """What every tool-loop request reads of the app, set once when the app starts (its engine
    needs the provider clients, which open then)."""

    settings: Settings
    registry: ToolRegistry
    state: StateStore
    engine: Engine
    instrumentation: Instrumentation
    upstreams: Upstreams
    limiter: Limiter | None = None  # the gateway keys' limits, when any is configured
    mcp: DeclaredServers | None = None  # responses_mcp_servers, when any is listed

    def offering(self, caller: Caller) -> Offering:
        """How the gateway's tools are offered to this caller. Hand-back mode: a client may declare
        a gateway tool (one that pauses for a reviewer, declared approval=True or raising
        Interrupt), to receive its paused calls; otherwise every caller is offered them alike."""
        settings = self.settings
        if settings.interrupt_mode != "hand_back":
            return self.alike
        return Offering(settings.offer_tools_on_empty_tools, self.registry.offered_names(caller.allowed),
                        self.mcp, self._provider_runs_mcp, settings.answer_record_max_bytes)

    @functools.cached_property
    def alike(self) -> Offering:
        return Offering(self.settings.offer_tools_on_empty_tools, mcp=self.mcp,
                        provider_runs_mcp=self._provider_runs_mcp,
                        whole_max_bytes=self.settings.answer_record_max_bytes)

    @functools.cached_property
    def _provider_runs_mcp(self) -> Callable[[str], bool] | None:
        """With responses_mcp_runner provider: whether every upstream a model routes to is OpenAI's
        (then OpenAI runs its `mcp` tools); None with the gateway runner."""
        if self.mcp is None or self.settings.responses_mcp_runner != "provider":
            return None
        kinds = {name: entry.kind for name, entry in self.settings.upstream_entries().items()}
        table = self.settings.routing_table()

        def all_openai(model: str) -> bool:
            route = table.route(model) or table.route_of_default()
            targets = (*route.primary, *route.fallbacks) if route is not None else ()
            return bool(targets) and all(kinds.get(t.upstream) == "openai" for t in targets)
        return all_openai


SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", ToolRegistry)
INSTRUMENTATION = web.AppKey("instrumentation", Instrumentation)
EXECUTOR = web.AppKey("executor", ToolExecutor)
STATE = web.AppKey("state", StateStore)
UPSTREAMS = web.AppKey("upstreams", Upstreams)  # every upstream, by name, and the routing over them
ENGINE = web.AppKey("engine", Engine)
LOOP = web.AppKey("loop", LoopParts)  # the tool loop's parts, together
MCP_SOURCES = web.AppKey("mcp_sources", McpSources)  # the MCP servers whose tools are in the registry
# the MCP servers a Responses request may declare (responses_mcp_servers): their tools are registered,
# and offered only to the requests that declare them
RESPONSES_MCP_SOURCES = web.AppKey("responses_mcp_sources", McpSources)
MCP_ENDPOINT = web.AppKey("mcp_endpoint", McpEndpoint)  # the registry as an MCP server, at /mcp
METRICS_PAGE = web.AppKey("metrics_page", MetricsPage)  # what GET /metrics answers
BROWSERS = web.AppKey("browsers", BrowserRule)  # the Host and Origin a request may come with
SECRET_HEADERS = web.AppKey("secret_headers", SecretNames)  # what stays behind with the caller's credentials
APPROVALS = web.AppKey("approvals", Approvals)  # tool calls waiting for a reviewer, and their decisions

CALLER = web.RequestKey("caller", Caller)  # who sent the request (authenticated on /v1 routes and /mcp)
TRACE = web.RequestKey("trace", RequestTrace)  # the request's span

QUOTA = web.RequestKey("quota", dict)  # what is left of the caller's limits, as response headers
RECORD = web.ResponseKey("record", RequestRecord)  # what the handler reports for telemetry
