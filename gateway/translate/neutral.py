"""What a request, an answer and a streamed answer say, in no API's words (issue 56): each wire
API reads its own JSON into these and writes these as its own JSON (gateway.translate.chat,
.messages), so that a request of one API reaches an upstream that speaks another through one
reader and one writer, N + M pieces rather than N x M pairs.

A conversation is a list of turns of the user and the assistant, each a list of parts; a tool's
result is a part of the user's turn, as Anthropic has it (Chat's `tool` messages become such
parts). Tool-call arguments are JSON text, as the model wrote them. What a side cannot express is
left out by its writer and named in `dropped` (a span attribute says so), or refused with a 400
naming the field where leaving it out would change what the model is asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Role = Literal["user", "assistant"]
# Why the model stopped: its answer is whole (end), it called tools, it ran out of tokens (length),
# it met a stop sequence, or a filter stopped it.
Stop = Literal["end", "tool_calls", "length", "stop_sequence", "content_filter"]
DEFAULT_MAX_TOKENS = 4096  # what a Messages request is given when its Chat client named no limit


def arguments_text(value: Any) -> str:
    """A tool call's arguments as JSON text (some compatible providers send an object instead)."""
    if value is None or isinstance(value, str):
        return value or ""
    return orjson.dumps(value).decode()


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Image:
    """An image: a URL (`https:` or `data:`), or base64 `data` of `media_type`."""

    url: str | None = None
    data: str | None = None
    media_type: str | None = None


@dataclass(frozen=True)
class Thinking:
    """The model's reasoning, as the provider gave it (`signature`: Anthropic's, which must come
    back unchanged with it; `redacted`: its encrypted form)."""

    text: str
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    content: tuple[Text | Image, ...]
    is_error: bool = False


Part = Text | Image | Thinking | ToolCall | ToolResult


@dataclass(frozen=True)
class Turn:
    role: Role
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class ToolDecl:
    name: str
    description: str | None
    parameters: dict[str, object]  # a JSON Schema object


# auto, none, any call (Chat's required, Anthropic's any), or this tool by name.
ToolChoice = Literal["auto", "none", "required"] | tuple[Literal["tool"], str]


@dataclass(frozen=True)
class Request:
    model: str
    system: tuple[str, ...]
    turns: tuple[Turn, ...]
    tools: tuple[ToolDecl, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    stream_usage: bool = False  # a Chat stream's client asked for the usage chunk
    user: str | None = None  # who the end user is, for the provider's abuse checks
    dropped: tuple[str, ...] = ()  # fields of the client's request that the reader left out


@dataclass(frozen=True)
class Usage:
    input_tokens: int | None = None  # cached ones included
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


@dataclass(frozen=True)
class Answer:
    answer_id: str
    model: str
    parts: tuple[Text | Thinking | ToolCall, ...]
    stop: Stop
    usage: Usage = field(default_factory=Usage)
    stop_sequence: str | None = None


# --- a streamed answer, as events ------------------------------------------------------------------
# Each part of the answer has an index, from 0 in the order the parts start; a part's pieces come
# after its start and before its end, and parts may interleave (parallel tool calls).

@dataclass(frozen=True)
class Started:
    answer_id: str
    model: str
    usage: Usage = field(default_factory=Usage)  # what the provider knows at the start (input tokens)


@dataclass(frozen=True)
class PartStarted:
    index: int
    part: Text | Thinking | ToolCall  # as it starts: empty text, or the call's id and name, no arguments


@dataclass(frozen=True)
class TextDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    index: int
    text: str = ""
    signature: str | None = None


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    json: str  # a fragment of the call's JSON arguments, to be joined to the ones before


@dataclass(frozen=True)
class PartEnded:
    index: int


@dataclass(frozen=True)
class Finished:
    stop: Stop
    usage: Usage = field(default_factory=Usage)
    stop_sequence: str | None = None


# An error event in the provider's stream never reaches a translation: gateway.provider.sse raises
# it as the call's failure, which the client's adapter shows in its own shape.
StreamEvent = Started | PartStarted | TextDelta | ThinkingDelta | ArgumentsDelta | PartEnded | Finished
