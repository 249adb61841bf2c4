"""create_app: the aiohttp application, its middleware and its routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from gateway import linking
from gateway.apis.registry import ADAPTERS, error_body_for
from gateway.caller import request_ids, resolve_caller
from gateway.engine import Engine
from gateway.engine.retries import retry_policy
from gateway.errors import GatewayError, error_response, from_http_exception, internal_error, log_provider_failure
from gateway.guardrails import Guardrails
from gateway.http.admission import Admission
from gateway.http.bodies import EXPECT
from gateway.http.browsers import browser_rule, check_browser
from gateway.http.keys import (
    APPROVALS,
    BROWSERS,
    CALLER,
    ENGINE,
    EXECUTOR,
    INSTRUMENTATION,
    LOOP,
    MCP_SOURCES,
    METRICS_PAGE,
    QUOTA,
    RECORD,
    REGISTRY,
    RESPONSES_MCP_SOURCES,
    SECRET_HEADERS,
    SETTINGS,
    STATE,
    TRACE,
    UPSTREAMS,
    LoopParts,
)
from gateway.http.metrics_page import MetricsPage, OwnMetrics
from gateway.instrumentation import Instrumentation, RequestInfo, RequestRecord
from gateway.limits import Limiter
from gateway.mcp import McpSources
from gateway.mcp.declared import DeclaredServers
from gateway.provider import paths as provider_paths
from gateway.provider.client import PROVIDER_NAMES, Upstream
from gateway.provider.route import ProviderRoute, provider_route
from gateway.provider.routing import Balancer
from gateway.provider.upstreams import Upstreams
from gateway.routes import (
    approvals,
    front,
    health,
    limits,
    loop,
    mcp,
    models,
    openapi,
    passthrough,
    response_ids,
    tools,
    websocket,
)
from gateway.routes.render import CLIENT_GONE
from gateway.settings.load import proxy_environment
from gateway.settings.model import Settings
from gateway.state import StateStore
from gateway.tools import ToolExecutor, ToolRegistry
from gateway.tools.approval_gate import Approvals
from gateway.tools.repair import RepairPolicy
from gateway.translate.pairs import TRANSLATED_TO
from gateway.ui import pages as ui
from gateway.wire.headers import TRACE_HEADER, TRAJECTORY_HEADER, secret_names

log = logging.getLogger("toolspan")
ADMISSION = web.AppKey("admission", Admission)
OWN_KEYS = web.AppKey("own_keys", bool)  # some upstream is called with a key of the gateway's
# How each upstream is reached, by name, by every route (gateway.provider.route).
PROVIDER_ROUTES = web.AppKey("provider_routes", dict[str, ProviderRoute])
SHUTDOWN_WRAP_UP_SECONDS = 5.0  # after the grace period, for requests whose provider calls were ended to answer


def _route_of(request: web.Request) -> str:
    """The matched route pattern: a bounded label, unlike the path."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request span around everything, the caller resolved once, and the one place errors
    become responses."""
    app = request.app  # a property that looks the app up: read once
    ids = request_ids(request.headers)
    info = RequestInfo(request.method, _route_of(request), request.path, request.headers, ids[0])
    with app[INSTRUMENTATION].request(info) as trace:
        request[TRACE] = trace
        error: GatewayError | None = None
        try:
            # Before anything else: a DNS-rebinding or cross-site page gets nothing, /healthz included.
            check_browser(request, app[BROWSERS])
            with app[ADMISSION].admit(request.path):
                # Before any body is read; only /v1 routes and /mcp speak for a caller.
                settings = app[SETTINGS]
                caller = resolve_caller(request.headers, ids, settings.keys,
                                        authenticate=request.path.startswith(("/v1/", "/openai/"))
                                        or request.path == mcp.PATH,
                                        own_key=app[OWN_KEYS], secret=app[SECRET_HEADERS])
                request[CALLER] = linking.by_session(caller, request.headers)
                response = await handler(request)
        except GatewayError as exc:
            error = exc
        except web.HTTPException as exc:
            error = from_http_exception(exc)
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            error = internal_error()
        if error is not None:
            log_provider_failure(error, request.method, request.path, trace.trace_id)
            provider_paths.log_once(app, error)  # a 404 of the provider's API path: said once
            response = error_response(error, error_body_for(request.path, request.headers))
            response.headers[TRAJECTORY_HEADER] = request[CALLER].trajectory_id if CALLER in request else ids[0]
            record = RequestRecord(error_type=error.type)
        else:
            record = response.get(RECORD) or RequestRecord()
        if CALLER in request and (principal := request[CALLER].principal) is not None:
            record = replace(record, principal=principal)  # with keys: which key's trajectory it is
        if CALLER in request and record.trajectory_source is None:  # a refused or passed-through request
            record = replace(record, trajectory_id=record.trajectory_id or request[CALLER].trajectory_id,
                             trajectory_source=request[CALLER].trajectory_source)
        # A client that left is counted as such (499), however the gateway found out.
        trace.finish(499 if record.error_type == CLIENT_GONE else response.status, record)
        return response


async def _stamp(request: web.Request, response: web.StreamResponse) -> None:
    """Every response names its trajectory and trace, streamed ones included."""
    if CALLER in request:
        response.headers.setdefault(TRAJECTORY_HEADER, request[CALLER].trajectory_id)
    if QUOTA in request:  # what is left of the key's limits (gateway.routes.quota)
        response.headers.update(request[QUOTA])
    if TRACE in request and (trace_id := request[TRACE].trace_id) is not None:
        response.headers[TRACE_HEADER] = trace_id  # none when there is no trace to name


async def _upstreams(app: web.Application) -> AsyncIterator[None]:
    """Each upstream's client, on a session of its own (its proxy and TLS), and the routing over them."""
    settings = app[SETTINGS]
    entries = settings.upstream_entries()
    sessions: list[aiohttp.ClientSession] = []
    clients: dict[str, Upstream] = {}
    for name, entry in entries.items():
        route = app[PROVIDER_ROUTES][name]
        connector = route.connector(settings.upstream_max_connections, settings.upstream_idle_seconds)
        sessions.append(session := aiohttp.ClientSession(auto_decompress=False, connector=connector))
        clients[name] = Upstream(session, entry.url, entry.key(), entry.timeout_seconds or 0.0,
                                 settings.upstream_connect_timeout_seconds, entry.kind,
                                 entry.azure_api_version or settings.azure_api_version,
                                 settings.upstream_max_connections, settings.upstream_idle_seconds,
                                 settings.max_json_depth, route)
    providers = {name: entry.provider_name or PROVIDER_NAMES[entry.kind] for name, entry in entries.items()}
    instrumentation = app[INSTRUMENTATION]
    upstreams = Upstreams(settings.routing_table(), clients, providers, app[STATE].cooldowns(settings.cooldown_rule()),
                          Balancer(settings.load_balancing), instrumentation.upstream_state, TRANSLATED_TO)
    app[UPSTREAMS] = upstreams
    limiter = (Limiter(settings.default_limits, settings.keys, settings.prices, app[STATE].limit_book(),
                       settings.limits_when_state_down, instrumentation)
               if Limiter.configured(settings.default_limits, settings.keys) else None)
    app[ENGINE] = Engine(upstreams, app[EXECUTOR], app[STATE], instrumentation, settings.max_rounds,
                         settings.keepalive_seconds, retry_policy(settings), settings.client_tool_check, limiter,
                         settings.client_result_guardrails)
    sources = app[RESPONSES_MCP_SOURCES]
    declared = (DeclaredServers(settings.responses_mcp_servers, app[REGISTRY], sources.why_down)
                if settings.responses_mcp_servers else None)  # none listed: nothing of a request's mcp tools is read
    app[LOOP] = LoopParts(settings, app[REGISTRY], app[STATE], app[ENGINE], instrumentation, upstreams, limiter,
                          declared)
    yield
    app[ENGINE].client_checks.close()
    await upstreams.aclose()
    for session in sessions:
        await session.close()


async def _wind_down(app: web.Application) -> None:
    """Shutting down (SIGTERM), once the server stopped taking connections: requests under way get
    `shutdown_grace_seconds` to finish; then their provider calls end (a stream answers with an
    error event, a plain request with a 503), and they get a few seconds to say so. The runner
    cancels what is left after that."""
    admission = app[ADMISSION]
    if await admission.drained(app[SETTINGS].shutdown_grace_seconds):
        return
    log.info("shutting down: ending %d requests still under way", admission.count)
    app[APPROVALS].end()
    if UPSTREAMS in app:
        app[UPSTREAMS].end()
    await admission.drained(SHUTDOWN_WRAP_UP_SECONDS)


def create_app(settings: Settings, registry: ToolRegistry, instrumentation: Instrumentation, state: StateStore,
               trajectories: ui.TrajectoryReader | None = None,
               metrics_page: MetricsPage | None = None) -> web.Application:
    """The gateway as an aiohttp application; its provider client opens when the app starts.
    `trajectories` reads the trajectory store for the page at /ui (None: the store is off).
    `state` holds turns and retry state between requests (runtime.build_state); the app closes it.
    `metrics_page` is what /metrics answers (None: this process's metrics)."""
    if not settings.has_upstream:
        raise ValueError("no upstream is set: give a provider URL (or upstreams), or start the built-in model")
    # aiohttp closes a connection that has not sent a whole request head this long after it opened
    # or after its last answer (its keep-alive timer): the header read timeout.
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[observe],
                          handler_args={"keepalive_timeout": settings.header_read_timeout_seconds})
    app[SETTINGS] = settings
    # Decided now, so that a bad proxy variable fails at start-up, naming it.
    environ = proxy_environment()
    entries = settings.upstream_entries()
    app[PROVIDER_ROUTES] = {name: provider_route(entry.url, entry.proxy, entry.ca_bundle, entry.client_cert,
                                                 entry.client_key, environ) for name, entry in entries.items()}
    # The caller's credentials travel on only where no upstream has a key of the gateway's.
    app[OWN_KEYS] = any(entry.api_key is not None or entry.api_key_env is not None for entry in entries.values())
    app[ADMISSION] = Admission(settings.max_concurrent_requests)
    app[BROWSERS] = browser_rule(settings)
    app[SECRET_HEADERS] = secret_names(settings.redact_keys)
    app.on_shutdown.append(_wind_down)
    app[REGISTRY] = registry
    app[INSTRUMENTATION] = instrumentation
    app[METRICS_PAGE] = metrics_page if metrics_page is not None else OwnMetrics(instrumentation)
    app[APPROVALS] = Approvals(state.approvals, settings.approval_timeout_seconds, app[SECRET_HEADERS])
    gate = app[APPROVALS] if settings.interrupt_mode == "wait" else None  # hand_back: the client answers
    registry.use_aliases(settings.tool_aliases)  # before anything reads the tools: they are replaced
    repair = RepairPolicy.configured(settings.argument_repair, settings.tool_argument_repair,
                                     {name: key.argument_repair for name, key in settings.keys.items()
                                      if key.argument_repair is not None}, list(registry))
    app[EXECUTOR] = ToolExecutor(registry, instrumentation, settings.tool_timeout_seconds, settings.tool_threads,
                                 gate, settings.approval_timeout_seconds, Guardrails.from_settings(settings, registry),
                                 repair)
    app.on_cleanup.append(lambda app: app[EXECUTOR].aclose())  # its pool of threads for sync tools
    app[STATE] = state
    app.on_cleanup.append(lambda app: app[STATE].aclose())
    app.cleanup_ctx.append(_upstreams)
    # MCP servers' tools join the registry at start-up, and follow their servers while it runs.
    app[MCP_SOURCES] = McpSources(settings.mcp_servers, registry, instrumentation, settings.mcp_max_message_bytes)
    app.cleanup_ctx.append(app[MCP_SOURCES].lifetime)
    # The servers a Responses request may declare: connected at start-up too, as the operator listed them
    # (a request never makes the gateway connect anywhere); their tools are offered only on request.
    app[RESPONSES_MCP_SOURCES] = McpSources(settings.responses_mcp_servers, registry, instrumentation,
                                            settings.mcp_max_message_bytes, on_request=True)
    app.cleanup_ctx.append(app[RESPONSES_MCP_SOURCES].lifetime)
    app.on_response_prepare.append(_stamp)
    for api in ADAPTERS.values():  # each wire API's tool loop, on the paths it names
        for path in api.paths:
            app.router.add_post(path, loop.handler(api), **EXPECT)
    for path in websocket.PATHS:  # a WebSocket upgrade there: a 426 at once (gateway.routes.websocket)
        app.router.add_get(path, websocket.responses_get, **EXPECT)
    app.router.add_get("/v1/tools", tools.list_tools, **EXPECT)
    app.router.add_post("/v1/tools/{name}/invoke", tools.invoke, **EXPECT)
    app.router.add_post("/v1/tools/{name}/parse", tools.parse, **EXPECT)
    response_ids.mount(app)  # gateway-made response ids: GET, input_items, DELETE, cancel
    approvals.mount(app)  # /v1/approvals: pending approvals of tool calls, and their decisions
    limits.mount(app)  # /v1/limits: the keys' limits and what they have used of them
    if settings.routing_table().offered():  # /v1/models: the models the upstreams table names
        models.mount(app)
    app.router.add_route("*", "/v1/{tail:.*}", passthrough.passthrough, **EXPECT)
    app.router.add_route("*", "/openai/{tail:.*}", passthrough.passthrough, **EXPECT)  # an Azure resource's others
    app.router.add_get("/metrics", health.metrics, **EXPECT)
    app.router.add_get("/healthz", health.healthz, **EXPECT)
    app.router.add_get("/readyz", health.readyz, **EXPECT)
    app.router.add_get("/openapi.json", openapi.openapi, **EXPECT)
    app.router.add_get("/", front.index, **EXPECT)  # where to go from here: /ui, /v1, /metrics, /healthz
    app[provider_paths.SEEN] = set()
    if settings.mcp_endpoint:
        mcp.mount(app)
    if settings.ui:
        ui.mount(app, trajectories)
    return app
