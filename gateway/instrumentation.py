"""What the gateway tells its observer at each step. `telemetry.Instrumentation` implements it
with spans and metrics; `NoInstrumentation` is what runs when telemetry is off."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.tools import NoHooks, ToolHooks

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass(frozen=True)
class RequestInfo:
    method: str
    route: str  # the matched route pattern, never the raw path (bounded labels)
    path: str
    headers: Mapping[str, str]
    trajectory_id: str


class RequestTrace(Protocol):
    @property
    def trace_id(self) -> str: ...

    def rounds(self, count: int, limit_reached: bool) -> None: ...

    def inject(self, headers: dict[str, str]) -> None: ...

    def trajectory(self, trajectory_id: str) -> None: ...

    def finish(self, status: int, error_type: str | None = None) -> None: ...


class ChatTrace(Protocol):
    def inject(self, headers: dict[str, str]) -> None: ...

    def response(self, body: Mapping[str, Any]) -> None: ...

    def failed(self, status: int | None, error_type: str, message: str) -> None: ...


class Instrumentation(ToolHooks, Protocol):
    def request(self, info: RequestInfo) -> AbstractContextManager[RequestTrace]: ...

    def chat(self, model: str, stream: bool) -> AbstractContextManager[ChatTrace]: ...

    def exposition(self, accept: str | None) -> tuple[bytes, str]: ...


class _NoRequestTrace:
    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id

    def rounds(self, count: int, limit_reached: bool) -> None:
        return None

    def inject(self, headers: dict[str, str]) -> None:
        return None  # the caller's own traceparent, if any, travels on unchanged

    def trajectory(self, trajectory_id: str) -> None:
        return None

    def finish(self, status: int, error_type: str | None = None) -> None:
        return None


class _NoChatTrace:
    def inject(self, headers: dict[str, str]) -> None:
        return None

    def response(self, body: Mapping[str, Any]) -> None:
        return None

    def failed(self, status: int | None, error_type: str, message: str) -> None:
        return None


class NoInstrumentation(NoHooks):
    """Telemetry off: no spans, no metrics; responses still carry a trace id (the caller's)."""

    @contextmanager
    def request(self, info: RequestInfo) -> Iterator[RequestTrace]:
        match = _TRACEPARENT.match(info.headers.get("traceparent", ""))
        yield _NoRequestTrace(match.group(1) if match else secrets.token_hex(16))

    @contextmanager
    def chat(self, model: str, stream: bool) -> Iterator[ChatTrace]:
        yield _NoChatTrace()

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        return b"# telemetry is off\n", "text/plain; version=0.0.4; charset=utf-8"
