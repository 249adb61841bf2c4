"""Typed keys for what lives on the app and on each request (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.instrumentation import Instrumentation, RequestTrace
from gateway.loop import ToolLoop
from gateway.settings import Settings
from gateway.tools import ToolExecutor, ToolRegistry
from gateway.turns import PendingTurns
from gateway.upstream import Upstream


@dataclass
class RequestScope:
    """Per-request facts the middleware sets up and the handlers read."""

    trajectory_id: str
    request_id: str
    trace: RequestTrace
    error_type: str | None = None  # set by a handler whose error could not change the status


SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", ToolRegistry)
INSTRUMENTATION = web.AppKey("instrumentation", Instrumentation)
EXECUTOR = web.AppKey("executor", ToolExecutor)
PENDING = web.AppKey("pending", PendingTurns)
UPSTREAM = web.AppKey("upstream", Upstream)
LOOP = web.AppKey("loop", ToolLoop)
SCOPE = web.RequestKey("scope", RequestScope)
