"""A Responses API request (as the Codex CLI, the Agents SDK and openai's `client.responses` send
it) read into the neutral request.

Input items become turns: a message is its role's text and images (a system or developer message,
wherever it stands, is a piece of the system prompt, after `instructions`), a `function_call` is
the assistant's call, a `function_call_output` the result in the user's turn, a `reasoning` item
the assistant's thinking (its summary: its encrypted content is OpenAI's own and goes nowhere
else). Consecutive items of one side merge into one turn, as Anthropic needs turns that alternate.

What only OpenAI's serving of the request tunes or keeps (store, include, reasoning effort,
metadata, truncation, service tier, cache keys) is left out and named in `dropped`, and so are the
two kinds of tool the Codex CLI declares in every request besides its functions: OpenAI's hosted
web search and a namespace of sub-agent functions (without them the model is asked the same, with
fewer tools). What would change the question (structured output, any other kind of tool, items of
those tools, a stored response to continue, files uploaded to OpenAI) is refused with a 400 naming
the field. Fields this reader does not know are left out and named too: the Codex CLI sends
several of its own (client_metadata, turn and thread ids).

(The request for a Responses upstream: responses_input.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.translate.fields import Dropped, Turns, cannot, image_of, invalid, number, optional
from gateway.translate.neutral import (
    Image,
    Request,
    Text,
    Thinking,
    ToolCall,
    ToolChoice,
    ToolDecl,
    ToolResult,
    arguments_text,
)

_READ = frozenset({"model", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls",
                   "max_output_tokens", "temperature", "top_p", "stream", "user", "safety_identifier", "text",
                   "store", "background"})
# Fields whose loss would change what is asked, and what they ask.
_REFUSED = {
    "previous_response_id": "a stored response of the Responses API, which this upstream cannot continue: send the "
                            "whole conversation as input instead",
    "conversation": "a conversation stored by the Responses API (send the whole conversation as input instead)",
    "prompt": "a prompt template stored by OpenAI"}
# Tools left out, named: OpenAI's hosted search (web_search, web_search_preview ...), which no other
# upstream runs, and namespaces of functions, whose calls name their namespace (no other API can).
_DROPPED_TOOLS = ("web_search", "namespace")
_NO_PARAMETERS: dict[str, object] = {"type": "object", "properties": {}}


# --- content ---------------------------------------------------------------------------------------

def _text_part(part: Mapping[str, Any]) -> str | None:
    """The text of a text part (input_text, output_text, or a refusal the assistant said)."""
    kind = part.get("type")
    text = part.get("refusal" if kind == "refusal" else "text")
    return text if kind in ("input_text", "output_text", "refusal") and isinstance(text, str) else None


def _image_part(part: Mapping[str, Any], where: str, dropped: Dropped) -> Image:
    if part.get("file_id") is not None:
        raise cannot("input.content.file_id", f"an image uploaded to OpenAI ({where}.file_id)")
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise invalid(f"{where}.image_url", "a URL")
    if part.get("detail") not in (None, "auto"):
        dropped.add("input.content.detail")
    return image_of(url)


def content_parts(content: Any, where: str, dropped: Dropped) -> list[Text | Image]:
    """A message's or a call output's content: a string, or text and image parts."""
    if isinstance(content, str):
        return [Text(content)]
    if not isinstance(content, list):
        raise invalid(where, "a string or a list of content parts")
    parts: list[Text | Image] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, Mapping):
            raise invalid(at, "a content part object")
        if (text := _text_part(part)) is not None:
            parts.append(Text(text))
        elif part.get("type") == "input_image":
            parts.append(_image_part(part, at, dropped))
        elif part.get("type") in ("input_file", "input_audio"):
            raise cannot("input.content", f"{part['type']} content ({at})")
        else:
            raise invalid(at, "an input_text, output_text or input_image part")
    return parts


# --- items -----------------------------------------------------------------------------------------

def _required_text(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{where}.{key}", "a non-empty string")
    return value


def _call(item: Mapping[str, Any], where: str) -> ToolCall:
    arguments = item.get("arguments")
    if arguments is not None and not isinstance(arguments, str | Mapping):
        raise invalid(f"{where}.arguments", "JSON text")
    return ToolCall(_required_text(item, "call_id", where), _required_text(item, "name", where),
                    arguments_text(arguments))


def _result(item: Mapping[str, Any], where: str, dropped: Dropped) -> ToolResult:
    output = item.get("output")
    return ToolResult(_required_text(item, "call_id", where),
                      tuple(content_parts("" if output is None else output, f"{where}.output", dropped)))


def _summary_texts(value: Any, kind: str, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(where, "a list")
    texts = []
    for j, part in enumerate(value):
        text = part.get("text") if isinstance(part, Mapping) and part.get("type") == kind else None
        if not isinstance(text, str):
            raise invalid(f"{where}[{j}]", f"a {kind} part")
        texts.append(text)
    return texts


def reasoning_text(item: Mapping[str, Any], where: str) -> str | None:
    """A reasoning item's text: its summary (the parts a paragraph apart), as OpenAI shows it; None
    when it has no summary part."""
    texts = _summary_texts(item.get("summary"), "summary_text", f"{where}.summary")
    return "\n\n".join(texts) if texts else None


class Conversation(Turns):
    """Input items read into the system prompt and the turns."""

    def __init__(self, system: list[str], dropped: Dropped) -> None:
        super().__init__()
        self.system = system
        self.dropped = dropped

    def add(self, i: int, item: Any) -> None:
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise invalid(where, "an input item object")
        match item.get("type", "message"):
            case "message":
                self._message(item, where)
            case "function_call":
                self._append("assistant", [_call(item, where)])
            case "function_call_output":
                self._append("user", [_result(item, where, self.dropped)])
            case "reasoning":
                self._reasoning(item, where)
            case str() as kind:
                raise cannot("input", f"a {kind} item ({where}): only the Responses API has it")
            case _:
                raise invalid(f"{where}.type", "an input item type")

    def _message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if item.get("phase") is not None:
            self.dropped.add("input.phase")
        parts = content_parts(item.get("content"), f"{where}.content", self.dropped)
        if role in ("system", "developer"):
            if any(isinstance(part, Image) for part in parts):
                raise cannot("input.content", f"an image in a {role} message ({where})")
            self.system.extend(part.text for part in parts if isinstance(part, Text))
        elif role in ("user", "assistant"):
            self._append(role, list(parts))
        else:
            raise invalid(f"{where}.role", "user, assistant, system or developer")

    def _reasoning(self, item: Mapping[str, Any], where: str) -> None:
        if item.get("encrypted_content") is not None:
            self.dropped.add("reasoning.encrypted_content")  # OpenAI's own: no other upstream reads it
        if (text := reasoning_text(item, where)) is not None:
            self._append("assistant", [Thinking(text)])


# --- fields ----------------------------------------------------------------------------------------

def _check_fields(body: Mapping[str, Any], dropped: Dropped) -> None:
    for key, value in body.items():
        if value is None or key in _READ:
            continue
        if key in _REFUSED:
            raise cannot(key, _REFUSED[key])
        dropped.add(key)
    if optional(body, "background", (bool,), "a boolean"):
        raise cannot("background", "a response run in the background and fetched later")
    if optional(body, "store", (bool,), "a boolean"):
        dropped.add("store")  # nothing is kept at the upstream to fetch later
    _check_text(body.get("text"), dropped)


def _check_text(text: Any, dropped: Dropped) -> None:
    if text is None:
        return
    if not isinstance(text, Mapping):
        raise invalid("text", "an object")
    form = text.get("format")
    if form is not None and not isinstance(form, Mapping):
        raise invalid("text.format", "an object")
    if form is not None and form.get("type") != "text":
        raise cannot("text.format", f"structured output ({form.get('type')})")
    if any(value is not None for key, value in text.items() if key != "format"):
        dropped.add("text")


def _tools(raw: Any, dropped: Dropped) -> tuple[ToolDecl, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid("tools", "a list")
    return tuple(decl for j, spec in enumerate(raw) if (decl := _tool(spec, f"tools[{j}]", dropped)) is not None)


def _tool(spec: Any, where: str, dropped: Dropped) -> ToolDecl | None:
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping) or not isinstance(kind, str):
        raise invalid(where, "a tool object")
    if kind.startswith(_DROPPED_TOOLS):
        dropped.add(f"tools.{kind}")
        return None
    if kind != "function":
        raise cannot("tools", f"a {kind} tool ({where}): only function tools can be offered to this upstream")
    description, parameters = spec.get("description"), spec.get("parameters")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.description", "a string")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise invalid(f"{where}.parameters", "a JSON Schema object")
    if spec.get("strict") is True:
        dropped.add("tools.strict")  # the upstream does not hold the model to the schema
    return ToolDecl(_required_text(spec, "name", where), description,
                    dict(parameters) if parameters is not None else dict(_NO_PARAMETERS))


def _tool_choice(raw: Any) -> ToolChoice | None:
    if raw is None or raw in ("auto", "none", "required"):
        return raw  # type: ignore[no-any-return]  # one of the literals, or None
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind == "function" and isinstance(name := raw.get("name"), str) and name:
        return ("tool", name)
    if isinstance(kind, str) and kind != "function":
        raise cannot("tool_choice", f"a tool_choice of type {kind}")
    raise invalid("tool_choice", '"auto", "none", "required" or {"type": "function", "name": ...}')


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value: int | None = optional(body, "max_output_tokens", (int,), "a positive integer")
    if value is not None and value < 1:
        raise invalid("max_output_tokens", "a positive integer")
    return value


def _user(body: Mapping[str, Any], dropped: Dropped) -> str | None:
    """Who the end user is: `user`, or the newer `safety_identifier` that replaces it."""
    user: str | None = optional(body, "user", (str,), "a string")
    safety: str | None = optional(body, "safety_identifier", (str,), "a string")
    if user is not None and safety is not None:
        dropped.add("safety_identifier")
    return user if user is not None else safety


def _conversation(body: Mapping[str, Any], dropped: Dropped) -> Conversation:
    instructions = optional(body, "instructions", (str,), "a string")
    conversation = Conversation([instructions] if instructions is not None else [], dropped)
    items = body.get("input")
    if isinstance(items, str):
        conversation.add(0, {"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            conversation.add(i, item)
    elif items is not None:
        raise invalid("input", "a string or a list of input items")
    return conversation


def read_request(body: Mapping[str, Any]) -> Request:
    """A Responses request as the neutral request; a BadRequest naming the field for what the
    neutral request cannot carry, or for a field of the wrong shape."""
    if not isinstance(body, Mapping):
        raise invalid("body", "a JSON object")
    dropped = Dropped()
    _check_fields(body, dropped)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "a non-empty string")
    conversation = _conversation(body, dropped)
    stream = bool(optional(body, "stream", (bool,), "a boolean"))
    return Request(
        model=model, system=tuple(conversation.system), turns=conversation.turns(),
        tools=_tools(body.get("tools"), dropped), tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=optional(body, "parallel_tool_calls", (bool,), "a boolean"),
        max_tokens=_max_tokens(body), temperature=number(body, "temperature"), top_p=number(body, "top_p"),
        stream=stream, stream_usage=stream,  # a Responses stream always ends with its usage
        user=_user(body, dropped), dropped=tuple(dropped.names))
