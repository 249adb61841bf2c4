"""Typed keys for what lives on the app and on each request (no module-level state)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiohttp import web

from gateway.instrumentation import Instrumentation, RequestTrace
from gateway.loop import ToolLoop
from gateway.settings import Settings
from gateway.tools import ToolExecutor, ToolRegistry
from gateway.turns import PendingTurns
from gateway.upstream import Upstream

_TRAJECTORY_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def is_trajectory_id(value: object) -> bool:
    """Ids we accept from callers: short, and safe in headers, labels and logs."""
    return isinstance(value, str) and _TRAJECTORY_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class Credentials:
    """Who the caller is, as far as gateway keys tell."""

    principal: str | None  # the gateway key's name
    allowed: frozenset[str] | None  # tools that key may use; None: all
    upstream_authorization: str | None  # what may travel on to the provider


@dataclass
class RequestScope:
    """Per-request facts the middleware sets up and the handlers read."""

    trajectory_id: str
    request_id: str
    trace: RequestTrace
    trajectory_sent: bool  # the caller named the trajectory in the X-Trajectory-Id header
    error_type: str | None = None  # set by a handler whose error could not change the status
    credentials: Credentials | None = None  # set for /v1 routes before the handler runs

    def adopt_trajectory(self, metadata: object) -> None:
        """A trajectory named in the request's `metadata` counts when the header named none."""
        named = metadata.get("trajectory_id") if isinstance(metadata, dict) else None
        if not self.trajectory_sent and is_trajectory_id(named):
            assert isinstance(named, str)
            self.trajectory_id = named
            self.trace.trajectory(named)


SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", ToolRegistry)
INSTRUMENTATION = web.AppKey("instrumentation", Instrumentation)
EXECUTOR = web.AppKey("executor", ToolExecutor)
PENDING = web.AppKey("pending", PendingTurns)
UPSTREAM = web.AppKey("upstream", Upstream)
LOOP = web.AppKey("loop", ToolLoop)
SCOPE = web.RequestKey("scope", RequestScope)
