"""The values that cross the tool boundary: context in, parse result between, outcome out."""

from __future__ import annotations

import json
import traceback as tb
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pydantic_core

from gateway.tools.params import NameCheck

# "unchecked": a client tool's call the gateway did not check (gateway.client_tools.check); no gateway call is.
# "denied": a reviewer refused the call its approval (gateway.tools.approvals).
Status = Literal["ok", "error", "rejected", "timeout", "interrupted", "unchecked", "denied"]
# schema_violation: values that do not fit the declared parameters (JSON Schema); parser: a
# parse_args or args_model refused them.
# guardrail_denied: a guardrail refused the call before it ran (gateway.guardrails).
RejectionReason = Literal["invalid_json", "missing_arguments", "schema_violation", "parser", "unknown_tool",
                          "not_allowed", "guardrail_denied"]
Content = str | list[dict[str, Any]]


class ToolError(Exception):
    """Raised by a tool body or parser to refuse deliberately; the message goes to the model
    verbatim."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = str(message)  # `raise ToolError(exc)` is common; the model needs text


class Interrupt(Exception):
    """Raised (or returned) by a tool body to pause for review. `message` goes to the model;
    `data` stays with the application."""

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = str(message)  # what the model sees must be text
        self.data = data


@dataclass(frozen=True)
class ToolResult:
    """Full control over what a tool returns."""

    content: Content
    processed_content: Any = None
    is_error: bool = False
    display_text: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    error_type: str | None = None  # with is_error: the outcome's error type (default "tool_error")


@dataclass(frozen=True)
class ToolOrigin:
    """Where the body of a tool runs when another program serves it (an MCP server's tool):
    what its `tool.call` span says about that program."""

    protocol: str  # "mcp"
    server: str  # the server's name in the settings
    method: str  # the request that runs the tool, "tools/call"
    remote_name: str  # the tool's name on that server
    transport: str  # "pipe" (stdio) or "tcp"
    protocol_version: str | None = None
    read_only: bool | None = None  # the server's readOnlyHint for it; None: it gave none
    annotations: Mapping[str, Any] | None = None  # its annotations as the server listed them (MCP's names)


@dataclass(frozen=True)
class ToolContext:
    """What a tool (and its parser) knows about the call besides its arguments."""

    tool_call_id: str
    trajectory_id: str | None = None
    request_id: str | None = None
    principal: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Parsed:
    """Arguments that passed the parse step: exactly what the body will receive. `unchecked`: why
    their values were not checked against the tool's schema (gateway.tools.schema_bounds.Skipped),
    when it asks for that check and it could not be made; the names were."""

    arguments: dict[str, Any]
    unchecked: str | None = None
    aliases: tuple[tuple[str, str], ...] = ()  # (alias sent, parameter) renamed before the checks


@dataclass(frozen=True)
class Rejection:
    """Arguments (or a call) refused before the body ran."""

    reason: RejectionReason
    message: str
    names: NameCheck | None = None
    exception: BaseException | None = None
    traceback: str | None = None
    aliases: tuple[tuple[str, str], ...] = ()  # (alias sent, parameter) renamed before the checks refused


@dataclass(frozen=True)
class Repair:
    """Arguments a repair would change (gateway.tools.repair): the call's as sent, and as repaired;
    `changes` says what was done, one entry a change (`rename file_path -> path`, `type a: string ->
    integer`, `wrap tags in an array`). `applied`: the call ran on the repaired arguments (mode apply);
    else they were only recorded (observe), and the call stayed rejected."""

    before: dict[str, Any]
    after: dict[str, Any]
    changes: tuple[str, ...]
    applied: bool


@dataclass(frozen=True)
class ToolOutcome:
    """One call's result, whatever happened. `content` is what the model sees."""

    call_id: str
    tool_name: str
    status: Status
    content: Content
    processed_content: Any = None
    exception: BaseException | None = None
    traceback: str | None = None
    display_text: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    rejection: Rejection | None = None
    names: NameCheck | None = None
    arguments: dict[str, Any] | None = None
    interrupt_data: Any = None
    error_type: str | None = None
    # why a client tool's call was not checked (gateway.client_tools.check.Unchecked), or a gateway tool's
    # values (Parsed.unchecked)
    unchecked: str | None = None
    aliases: tuple[tuple[str, str], ...] = ()  # the aliases the arguments used (Parsed.aliases)
    repair: Repair | None = None  # what repair found for the arguments (gateway.tools.repair)

    def __post_init__(self) -> None:
        # The content goes upstream as JSON, which must be UTF-8: a lone surrogate (a model's
        # JSON escape echoed back, a file name decoded with surrogateescape) would fail there.
        object.__setattr__(self, "content", valid_json(self.content))

    @property
    def failed(self) -> bool:
        return self.status in ("error", "rejected", "timeout", "denied")

    def content_text(self) -> str:
        """The content as one string (text parts joined), for logs and span descriptions."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(str(part.get("text", "")) for part in self.content if isinstance(part, dict))


def valid_text(text: str) -> str:
    """`text` as valid Unicode: each lone surrogate (which JSON escapes can carry and UTF-8
    cannot) becomes U+FFFD; a surrogate pair split over two code points is joined."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def valid_json(value: Any) -> Any:
    """`value` with `valid_text` applied to every string in its dicts and lists, keys included
    (other values are left as they are)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_json(k): valid_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_json(item) for item in value]
    return value


def exception_text(exc: BaseException) -> str:
    """str(exc), for exceptions whose __str__ itself fails too."""
    try:
        return str(exc)
    except Exception:
        return "<exception str() failed>"


def rescued_message(exc: BaseException) -> str:
    """The short form a model sees for an exception nobody meant to raise."""
    return f"ERROR: ({type(exc).__name__}) {exception_text(exc)}"


def format_traceback(exc: BaseException) -> str:
    return "".join(tb.format_exception(exc))


def rejected(call_id: str, tool_name: str, rejection: Rejection) -> ToolOutcome:
    return ToolOutcome(
        call_id=call_id,
        tool_name=tool_name,
        status="rejected",
        content=rejection.message,
        exception=rejection.exception,
        traceback=rejection.traceback,
        rejection=rejection,
        names=rejection.names,
        error_type=rejection.reason,
        aliases=rejection.aliases,
    )


def encode(value: Any) -> str:
    """JSON text for a tool's native result; raises ValueError when it cannot be encoded."""
    try:
        return _to_json(value)
    except ValueError as exc:
        try:
            return _to_json(valid_json(value))  # lone surrogates in its strings, say: tried again without
        except (ValueError, RecursionError):
            raise exc from None


def _to_json(value: Any) -> str:
    try:
        return pydantic_core.to_json(value, inf_nan_mode="null").decode()  # NaN is not JSON
    except pydantic_core.PydanticSerializationError as exc:
        raise ValueError(str(exc)) from exc


def normalise(value: Any, template: ToolOutcome) -> ToolOutcome:
    """Turn whatever a body returned into an outcome; `template` carries the call's identity."""
    if isinstance(value, Interrupt):
        return replace(template, status="interrupted", content=value.message, interrupt_data=value.data)
    if isinstance(value, ToolResult):
        return _from_tool_result(value, template)
    if isinstance(value, str):
        return replace(template, status="ok", content=value)
    try:
        text = encode(value)
    except ValueError as exc:
        return failure(template, TypeError(f"result of type {type(value).__name__} cannot be sent to the model: {exc}"))
    return replace(template, status="ok", content=text, processed_content=value)


def failure(template: ToolOutcome, exc: BaseException, content: str | None = None) -> ToolOutcome:
    """An error outcome that keeps the exception and its traceback for the application."""
    return replace(template, status="error", content=content if content is not None else rescued_message(exc),
                   exception=exc, traceback=format_traceback(exc), error_type=type(exc).__name__)


def _from_tool_result(value: ToolResult, template: ToolOutcome) -> ToolOutcome:
    content = value.content
    if not isinstance(content, str):
        try:
            # Plain JSON values from here on (a datetime becomes its ISO text, and so on).
            content = json.loads(encode(content))
            ok = isinstance(content, list) and all(isinstance(p, dict) for p in content)
        except ValueError:
            ok = False
        if not ok:
            return failure(template, TypeError("ToolResult.content must be a string or a list of JSON content parts"))
    return replace(
        template,
        status="error" if value.is_error else "ok",
        content=content,
        processed_content=value.processed_content,
        options=dict(value.options),
        display_text=value.display_text or template.display_text,
        error_type=(value.error_type or "tool_error") if value.is_error else None,
    )


def masked_content(content: Content, text: str) -> Content:
    """`content` with its text replaced by `text`, as a guardrail masked it (gateway.guardrails): a
    string becomes `text`; in a list of parts, the text parts give way to one holding `text`, where
    the first of them was."""
    if isinstance(content, str):
        return text
    parts: list[dict[str, Any]] = []
    placed = False
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            if not placed:
                parts.append({"type": "text", "text": text})
                placed = True
            continue
        parts.append(part)
    return parts if placed else [{"type": "text", "text": text}, *parts]
