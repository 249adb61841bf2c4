"""A Chat Completions request read into the neutral Request.

Reading: system and developer messages are the system prompt (each text part one piece of it,
wherever the message stands); a `tool` message is a result in the user's turn, and consecutive
messages of one side merge into one turn (tool results first), as Anthropic needs turns that
alternate. A field with no neutral meaning is left out and named in `dropped` where losing it
leaves the question the same (sampling penalties, logprobs, a seed ...), and refused with a 400
naming it where it would not (several choices, structured output, audio ...).

(The request for a Chat upstream: chat_request_writing.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import BadRequest
from gateway.translate.chat_answer import THINKING_FIELDS
from gateway.translate.fields import Dropped, Turns, cannot, image_of, invalid, number, optional
from gateway.translate.neutral import (
    Part,
    Request,
    Text,
    ToolCall,
    ToolChoice,
    ToolDecl,
    ToolResult,
    arguments_text,
)

# Fields left out, named in `dropped`: without them the model is asked the same.
_HARMLESS = frozenset({
    "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "seed", "store", "metadata",
    "service_tier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "reasoning_effort",
    "verbosity", "prediction"})
# Fields whose loss would change what is asked, and what they ask.
_INEXPRESSIBLE = {
    "audio": "audio output", "functions": "legacy functions (declare them as tools)",
    "function_call": "a legacy function_call (use tool_choice)", "web_search_options": "a web search by the provider",
    "moderation": "the provider's moderation of the request"}
_READ = frozenset({
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "stop", "stream", "stream_options", "user", "safety_identifier", "n", "response_format",
    "modalities"})
_NO_PARAMETERS: dict[str, object] = {"type": "object", "properties": {}}


# --- reading -------------------------------------------------------------------------------------

def _check_fields(body: Mapping[str, Any], dropped: Dropped) -> None:
    for key, value in body.items():
        if value is None or key in _READ:
            continue
        if key in _HARMLESS:
            dropped.add(key)
        elif key in _INEXPRESSIBLE:
            raise cannot(key, _INEXPRESSIBLE[key])
        else:
            raise BadRequest(f"{key} is not a Chat Completions field that can be translated: the upstream's API "
                             "cannot express it", param=key)
    _check_choices(body.get("n"), dropped)
    _check_format(body.get("response_format"), dropped)
    _check_modalities(body.get("modalities"), dropped)


def _check_choices(n: Any, dropped: Dropped) -> None:
    if n is None:
        return
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise invalid("n", "a positive integer")
    if n > 1:
        raise cannot("n", "several choices")
    dropped.add("n")


def _check_format(response_format: Any, dropped: Dropped) -> None:
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "text":
        dropped.add("response_format")
    elif isinstance(kind, str):
        raise cannot("response_format", f"structured output ({kind})")
    else:
        raise invalid("response_format", "an object with a type")


def _check_modalities(modalities: Any, dropped: Dropped) -> None:
    if modalities is None:
        return
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
        raise invalid("modalities", "a list of strings")
    if any(m != "text" for m in modalities):
        raise cannot("modalities", "output other than text")
    dropped.add("modalities")


def _texts(content: Any, where: str) -> list[str]:
    """Content that may only be text: a string, or text parts."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise invalid(where, "text or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        text = part.get("text") if isinstance(part, Mapping) and part.get("type") == "text" else None
        if not isinstance(text, str):
            raise invalid(f"{where}[{j}]", "a text part")
        texts.append(text)
    return texts


def _call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise invalid(where, "a tool call object")
    if raw.get("type", "function") != "function":
        raise cannot(f"{where}.type", f"a {raw.get('type')} tool call")
    function, call_id = raw.get("function"), raw.get("id")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.id", "a non-empty string")
    if not isinstance(function, Mapping) or not isinstance(name, str) or not name:
        raise invalid(f"{where}.function.name", "a non-empty string")
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str | Mapping):
        raise invalid(f"{where}.function.arguments", "JSON text")
    return ToolCall(call_id, name, arguments_text(arguments))


class _Conversation(Turns):
    """Messages read into the system prompt and the turns."""

    def __init__(self, dropped: Dropped) -> None:
        super().__init__()
        self.dropped = dropped
        self.system: list[str] = []

    def add(self, i: int, message: Any) -> None:
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise invalid(where, "a message object")
        if message.get("name") is not None:
            self.dropped.add("messages.name")
        match message.get("role"):
            case "system" | "developer":
                self.system.extend(_texts(message.get("content"), f"{where}.content"))
            case "user":
                self._append("user", self._user_parts(message.get("content"), f"{where}.content"))
            case "assistant":
                self._append("assistant", self._assistant_parts(message, where))
            case "tool":
                self._append("user", [self._result(message, where)])
            case "function":
                raise cannot(f"{where}.role", "a legacy function message (send tool messages)")
            case _:
                raise invalid(f"{where}.role", "system, developer, user, assistant or tool")

    def _user_parts(self, content: Any, where: str) -> list[Part]:
        if isinstance(content, str):
            return [Text(content)]
        if not isinstance(content, list):
            raise invalid(where, "text or a list of content parts")
        return [self._user_part(part, f"{where}[{j}]") for j, part in enumerate(content)]

    def _user_part(self, part: Any, where: str) -> Part:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(text := part.get("text"), str):
            return Text(text)
        if kind == "image_url":
            image = part.get("image_url")
            if not isinstance(image, Mapping) or not isinstance(image.get("url"), str):
                raise invalid(f"{where}.image_url.url", "a URL")
            if image.get("detail") not in (None, "auto"):
                self.dropped.add("image_url.detail")
            return image_of(image["url"])
        if kind in ("input_audio", "file"):
            raise cannot(f"{where}.type", f"{kind} content")
        raise invalid(where, "a text or image_url part")

    def _assistant_parts(self, message: Mapping[str, Any], where: str) -> list[Part]:
        for key in ("audio", "function_call"):
            if message.get(key) is not None:
                raise cannot(f"{where}.{key}", f"an assistant's {key}")
        if any(message.get(key) for key in THINKING_FIELDS):
            self.dropped.add("messages.reasoning_content")  # unsigned: no upstream of another API takes it back
        parts: list[Part] = [Text(text) for text in self._assistant_texts(message, where) if text]
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise invalid(f"{where}.tool_calls", "a list")
        parts.extend(_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls or []))
        return parts

    def _assistant_texts(self, message: Mapping[str, Any], where: str) -> list[str]:
        content, refusal = message.get("content"), message.get("refusal")
        texts = [refusal] if isinstance(refusal, str) else []
        if content is None or isinstance(content, str):
            return [content or "", *texts]
        if not isinstance(content, list):
            raise invalid(f"{where}.content", "text or a list of text parts")
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            text = part.get(kind) if kind in ("text", "refusal") else None
            if not isinstance(text, str):
                raise invalid(f"{where}.content[{j}]", "a text or refusal part")
            texts.append(text)
        return texts

    def _result(self, message: Mapping[str, Any], where: str) -> ToolResult:
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"{where}.tool_call_id", "a non-empty string")
        return ToolResult(call_id, tuple(Text(text) for text in _texts(message.get("content"), f"{where}.content")))


def _tools(raw: Any, dropped: Dropped) -> tuple[ToolDecl, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid("tools", "a list")
    return tuple(_tool(spec, f"tools[{j}]", dropped) for j, spec in enumerate(raw))


def _tool(spec: Any, where: str, dropped: Dropped) -> ToolDecl:
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if kind != "function":
        raise cannot(f"{where}.type", f"a {kind} tool") if isinstance(kind, str) else invalid(where, "a tool object")
    function = spec.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(name, str) or not name:
        raise invalid(f"{where}.function.name", "a non-empty string")
    description, parameters = function.get("description"), function.get("parameters")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.function.description", "a string")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise invalid(f"{where}.function.parameters", "a JSON Schema object")
    if function.get("strict") is not None:
        dropped.add("tools.function.strict")
    return ToolDecl(name, description, dict(parameters) if parameters is not None else dict(_NO_PARAMETERS))


def _tool_choice(raw: Any) -> ToolChoice | None:
    if raw is None or raw in ("auto", "none", "required"):
        return raw  # type: ignore[no-any-return]  # one of the literals, or None
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if kind == "function" and isinstance(function, Mapping) and isinstance(name := function.get("name"), str):
        return ("tool", name)
    if isinstance(kind, str) and kind != "function":
        raise cannot("tool_choice", f"a tool_choice of type {kind}")
    raise invalid("tool_choice", '"auto", "none", "required" or a named function')


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value: int | None = optional(body, key, (int,), "a positive integer")
    if value is not None and value < 1:
        raise invalid(key, "a positive integer")
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("stop", "a string or a list of strings")
    return tuple(stop)


def _stream_usage(body: Mapping[str, Any], dropped: Dropped) -> bool:
    options = optional(body, "stream_options", (Mapping,), "an object") or {}
    for key, value in options.items():
        if key != "include_usage" and value is not None:
            dropped.add(f"stream_options.{key}")
    if not isinstance(options.get("include_usage"), bool | None):
        raise invalid("stream_options.include_usage", "a boolean")
    return bool(options.get("include_usage"))


def _user(body: Mapping[str, Any], dropped: Dropped) -> str | None:
    """Who the end user is: `user`, or the newer `safety_identifier` that replaces it."""
    user: str | None = optional(body, "user", (str,), "a string")
    safety: str | None = optional(body, "safety_identifier", (str,), "a string")
    if user is not None and safety is not None:
        dropped.add("safety_identifier")
    return user if user is not None else safety


def read_request(body: Mapping[str, Any]) -> Request:
    """A Chat Completions request as the neutral request; a BadRequest naming the field for what
    the neutral request cannot carry, or for a field of the wrong shape."""
    dropped = Dropped()
    _check_fields(body, dropped)
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        raise invalid("model", "a non-empty string")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "a non-empty list")
    conversation = _Conversation(dropped)
    for i, message in enumerate(messages):
        conversation.add(i, message)
    return Request(
        model=model, system=tuple(conversation.system), turns=conversation.turns(),
        tools=_tools(body.get("tools"), dropped), tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=optional(body, "parallel_tool_calls", (bool,), "a boolean"), max_tokens=_max_tokens(body),
        temperature=number(body, "temperature"), top_p=number(body, "top_p"), stop=_stop(body),
        stream=bool(optional(body, "stream", (bool,), "a boolean")), stream_usage=_stream_usage(body, dropped),
        user=_user(body, dropped), dropped=tuple(dropped.names))
