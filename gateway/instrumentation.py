"""What the gateway tells its observer at each step. `telemetry.instrument.Telemetry` implements
it with spans and metrics; `NoInstrumentation` is what runs when telemetry is off."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.tools import NoHooks, ToolHooks

# A W3C traceparent naming a valid trace: version ff, an all-zero trace id and an all-zero span id
# are invalid.
_TRACEPARENT = re.compile(r"^(?!ff)[0-9a-f]{2}-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")

# The routes a health checker or a scraper calls every few seconds: no span and no request counted
# for them unless asked (Settings.telemetry_count_probes), or each scrape would put a trace into
# the tracing backend and the request panels would count the checks.
PROBE_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass(frozen=True)
class RequestInfo:
    """A request as it arrives."""

    method: str
    route: str  # the matched route pattern, never the raw path (bounded labels)
    path: str
    headers: Mapping[str, str]
    trajectory_id: str


@dataclass(frozen=True)
class RequestRecord:
    """What a handler returns for telemetry to record about the request it answered."""

    trajectory_id: str | None = None  # the trajectory the request belonged to, if not the header's
    rounds: int | None = None  # provider calls made, for requests that ran the tool loop
    limit_reached: bool = False  # the round limit ended the loop
    error_type: str | None = None  # what went wrong after the status was sent (a stream's failure)
    principal: str | None = None  # the name of the gateway key that sent the request
    trajectory_source: str | None = None  # how its trajectory was found (Caller.trajectory_source)
    held_turn_lost: bool = False  # it continued a turn (or gateway response) the gateway no longer held


class MessageView(Protocol):
    """How one wire API's requests and answers read as messages in the GenAI conventions' words
    (`{"role", "parts"}`: gateway.apis.genai): each adapter's own, read only when message content
    is captured."""

    def instructions(self, body: Mapping[str, Any]) -> str | None:
        """Instructions sent apart from the history (Responses' `instructions`, Messages' `system`)."""

    def history(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The conversation a request sends, as messages."""

    def tools(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The tools a request offers the model, as tool definitions (`{"type", "name"}`, and of a
        function its `description` and `parameters`)."""

    def answer_parts(self, output: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The parts of an answer's output."""


class ModelAnswer(Protocol):
    """What a provider call's span records of its answer (engine.turn.ModelTurn is one)."""

    @property
    def output(self) -> Sequence[Mapping[str, Any]]:
        """The answer's output in its API's shape (read through the call's MessageView, only when
        message content is captured)."""

    @property
    def response_id(self) -> str | None:
        """The provider's id of its answer."""

    @property
    def model(self) -> str | None:
        """The model that answered, as the provider names it."""

    @property
    def finish_reason(self) -> str | None:
        """Why the answer ended, in Chat's terms (stop, tool_calls, length ...)."""

    @property
    def input_tokens(self) -> int | None:
        """Tokens of the prompt, as the provider counted them."""

    @property
    def output_tokens(self) -> int | None:
        """Tokens of the answer, as the provider counted them."""


class RequestTrace(Protocol):
    """The span of one request, current while its handler runs."""

    @property
    def trace_id(self) -> str | None:
        """The trace's id in hex, for the X-Trace-Id header; None when the request belongs to no
        valid trace (tracing off and no trace context from the caller)."""

    def inject(self, headers: dict[str, str]) -> None:
        """Write this request's trace context into headers of a request passed on as it is."""

    def finish(self, status: int, record: RequestRecord) -> None:
        """The status sent and what the handler returned; recorded when the scope ends."""


class ChatTrace(Protocol):
    """The span of one provider call."""

    def inject(self, headers: dict[str, str]) -> None:
        """Write this call's trace context into the provider request's headers."""

    def sent(self, view: MessageView, body: Mapping[str, Any]) -> None:
        """The request as it goes upstream, and how its API reads (for the answer too); kept by
        reference, and read only when message content is captured."""

    def answered(self, answer: ModelAnswer) -> None:
        """The provider answered (a whole stream, when streamed)."""

    def failed(self, status: int | None, error_type: str, message: str) -> None:
        """The call failed: the provider's status if it sent one."""

    def retried(self, attempt: int) -> None:
        """This call is attempt `attempt` (2 and up) of one the gateway retried itself."""

    def resent(self) -> None:
        """The request went out once more, on a new connection: the kept-alive one it was first
        sent on closed before any byte of an answer came."""

    def fell_back(self, source: str, reason: str) -> None:
        """This call went to its upstream after one to `source` failed, for `reason`, before answering."""

    def translated(self, pair: str, dropped: tuple[str, ...]) -> None:
        """This call was made in another API than its client's (`pair`: messages->chat), leaving
        out what that API cannot say (`dropped`: the fields)."""


class Instrumentation(ToolHooks, Protocol):
    """The observer create_app is handed: requests, provider calls and (as ToolHooks) tool calls."""

    def request(self, info: RequestInfo) -> AbstractContextManager[RequestTrace]:
        """The scope of one request, from its arrival to its answer."""

    def chat(self, model: str, stream: bool, upstream: str, provider: str, trajectory: str | None = None,
             principal: str | None = None) -> AbstractContextManager[ChatTrace]:
        """The scope of one provider call (a whole stream, when streamed) to a configured upstream,
        `provider` its gen_ai.provider.name, in `trajectory` of the gateway key named `principal`."""

    def upstream_state(self, upstream: str, up: bool) -> None:
        """An upstream is in its routes (`up`), or cooling down after failures."""

    def limit_refused(self, key: str, limit: str) -> None:
        """A limit of gateway key `key` ("" without keys) refused a request or the rest of its loop."""

    def limit_usage(self, key: str, limit: str, used: int, bound: int) -> None:
        """What `key` has used of `limit` in its window, as just checked."""

    def limits_unavailable(self) -> None:
        """A limit could not be checked (the shared state unreachable) and was let through."""

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics page and its content type, in the format `accept` asks for."""


class _NoRequestTrace:
    def __init__(self, trace_id: str | None) -> None:
        self.trace_id = trace_id

    def inject(self, headers: dict[str, str]) -> None:
        return None  # the caller's own traceparent, if any, travels on unchanged

    def finish(self, status: int, record: RequestRecord) -> None:
        return None


class _NoChatTrace:
    def inject(self, headers: dict[str, str]) -> None:
        return None

    def sent(self, view: MessageView, body: Mapping[str, Any]) -> None:
        return None

    def answered(self, answer: ModelAnswer) -> None:
        return None

    def failed(self, status: int | None, error_type: str, message: str) -> None:
        return None

    def retried(self, attempt: int) -> None:
        return None

    def resent(self) -> None:
        return None

    def fell_back(self, source: str, reason: str) -> None:
        return None

    def translated(self, pair: str, dropped: tuple[str, ...]) -> None:
        return None


def untraced(info: RequestInfo) -> AbstractContextManager[RequestTrace]:
    """A request's scope with no span and no metrics: its response names the caller's trace, if
    it sent one."""
    match = _TRACEPARENT.match(info.headers.get("traceparent", ""))
    return nullcontext(_NoRequestTrace(match.group(1) if match else None))


class NoInstrumentation(NoHooks):
    """Telemetry off: no spans, no metrics; responses name the caller's trace, if it sent one.
    Its scopes are nullcontexts, not generator-based context managers, which cost several times as
    much; with the same change in Admission and Upstream, a plain request takes measurably less CPU
    (docs/benchmarks.md)."""

    def __init__(self) -> None:
        self._chat_trace = _NoChatTrace()  # holds nothing: every provider call may share it

    def request(self, info: RequestInfo) -> AbstractContextManager[RequestTrace]:
        return untraced(info)

    def chat(self, model: str, stream: bool, upstream: str, provider: str, trajectory: str | None = None,
             principal: str | None = None) -> AbstractContextManager[ChatTrace]:
        return nullcontext(self._chat_trace)

    def upstream_state(self, upstream: str, up: bool) -> None:
        return None

    def limit_refused(self, key: str, limit: str) -> None:
        return None

    def limit_usage(self, key: str, limit: str, used: int, bound: int) -> None:
        return None

    def limits_unavailable(self) -> None:
        return None

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        return b"# telemetry is off\n", "text/plain; version=0.0.4; charset=utf-8"
