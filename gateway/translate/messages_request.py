"""A Messages request (as Claude Code and Anthropic's SDKs send it) read into the neutral request,
and the neutral request written as one for an Anthropic upstream.

Reading refuses, with a 400 naming the field, what an upstream of another API cannot be asked
(Anthropic's server tools, its MCP connector, a structured output format, documents) and leaves
out, naming it in `dropped`, what only tunes Anthropic's own serving (cache_control, top_k, the
thinking budget, service tiers)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gateway.errors import BadRequest
from gateway.translate.messages_blocks import (
    Malformed,
    anthropic_call_id,
    assistant_part,
    image_block,
    neutral_call_id,
    read_image,
    thinking_block,
    tool_use_block,
)
from gateway.translate.neutral import (
    DEFAULT_MAX_TOKENS,
    Image,
    Part,
    Request,
    Text,
    Thinking,
    ToolCall,
    ToolChoice,
    ToolDecl,
    ToolResult,
    Turn,
)

# Fields read into the neutral request; `thread` is the gateway's own (gateway.apis.messages.threads).
READ = frozenset({"model", "messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences",
                  "temperature", "top_p", "metadata", "stream", "thread"})
SYSTEM_JOINER = "\n\n"  # Chat's several system messages, as the one system prompt Anthropic is given
CHOICES: dict[str, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}
TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema"})
USER_BLOCKS = frozenset({"text", "image", "tool_result"})
ASSISTANT_BLOCKS = frozenset({"text", "thinking", "redacted_thinking", "tool_use"})


def _refuse(field: str, message: str) -> BadRequest:
    return BadRequest(f"{field}: {message}", param=field)


def _typed(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """body[key], None when absent, a 400 when it is not of `kind` (a bool is no number)."""
    value = body.get(key)
    if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
        raise _refuse(key, f"must be {what}")
    return value


# --- reading -----------------------------------------------------------------------------------------

def _system(value: Any, dropped: list[str]) -> tuple[str, ...]:
    if value is None or isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, list):
        raise _refuse("system", "must be a string or a list of text blocks")
    texts = []
    for i, block in enumerate(value):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise _refuse(f"system[{i}]", "must be a text block")
        dropped += [key for key in ("cache_control", "citations") if block.get(key) is not None]
        texts.append(block["text"])
    return tuple(text for text in texts if text)


def _result_content(value: Any, where: str, dropped: list[str]) -> tuple[Text | Image, ...]:
    if value is None or isinstance(value, str):
        return (Text(value),) if value else ()
    if not isinstance(value, list):
        raise _refuse(f"{where}.content", "must be a string or a list of blocks")
    content: list[Text | Image] = []
    for i, block in enumerate(value):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind not in ("text", "image"):
            raise _refuse(f"{where}.content[{i}]", f"a `{kind}` block in a tool result cannot be said to an "
                                                   "upstream of another API (text and images can)")
        dropped += ["cache_control"] if block.get("cache_control") is not None else []
        if kind == "image":
            content.append(_image(block, f"{where}.content[{i}]"))
        elif isinstance(text := block.get("text"), str):
            content.append(Text(text))
        else:
            raise _refuse(f"{where}.content[{i}].text", "must be a string")
    return tuple(content)


def _image(block: Mapping[str, Any], where: str) -> Image:
    try:
        return read_image(block)
    except Malformed as exc:
        raise _refuse(where, str(exc)) from exc


def _tool_result(block: Mapping[str, Any], where: str, dropped: list[str]) -> ToolResult:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise _refuse(f"{where}.tool_use_id", "must be a string")
    return ToolResult(neutral_call_id(call_id), _result_content(block.get("content"), where, dropped),
                      block.get("is_error") is True)


def _part(block: Any, role: str, where: str, dropped: list[str]) -> Part:
    kind = block.get("type") if isinstance(block, Mapping) else None
    kind = kind if isinstance(kind, str) else None
    if kind not in (USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS):
        raise _refuse(where, f"a `{kind}` block in the {role}'s message cannot be said to an upstream of another API")
    dropped += [key for key in ("cache_control", "citations") if block.get(key) is not None]
    if kind == "tool_result":
        return _tool_result(block, where, dropped)
    if kind == "image":
        return _image(block, where)
    try:
        part = assistant_part(block)
    except Malformed as exc:
        raise _refuse(f"{where}.{exc.field}" if exc.field else where, str(exc)) from exc
    assert part is not None  # every kind of ASSISTANT_BLOCKS and text has a part
    return part


def _turn(message: Any, where: str, dropped: list[str]) -> Turn:
    role = message.get("role") if isinstance(message, Mapping) else None
    if role not in ("user", "assistant"):
        raise _refuse(f"{where}.role", "must be user or assistant")
    content = message.get("content")
    if isinstance(content, str):
        return Turn(role, (Text(content),) if content else ())
    if not isinstance(content, list):
        raise _refuse(f"{where}.content", "must be a string or a list of blocks")
    return Turn(role, tuple(_part(block, role, f"{where}.content[{i}]", dropped) for i, block in enumerate(content)))


def _tool(spec: Any, where: str, dropped: list[str]) -> ToolDecl:
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _refuse(f"{where}.name", "must be a non-empty string")
    if spec.get("type") not in (None, "custom"):
        raise _refuse("tools", f"{name} is Anthropic's own {spec['type']} tool, which Anthropic runs on its side: "
                               "an upstream of another API cannot offer it")
    schema, description = spec.get("input_schema"), spec.get("description")
    if not isinstance(schema, Mapping):
        raise _refuse(f"{where}.input_schema", "must be a JSON Schema object")
    if description is not None and not isinstance(description, str):
        raise _refuse(f"{where}.description", "must be a string")
    dropped += [key if key == "cache_control" else f"tools.{key}" for key in spec if key not in TOOL_FIELDS]
    return ToolDecl(name, description, dict(schema))


def _tool_choice(value: Any) -> tuple[ToolChoice | None, bool | None]:
    """The choice, and whether parallel calls are allowed (None: Anthropic's default, they are)."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, Mapping) else None
    kind = kind if isinstance(kind, str) else None
    parallel = False if kind and value.get("disable_parallel_tool_use") is True else None
    if kind in CHOICES:
        return CHOICES[kind], parallel
    if kind == "tool" and isinstance(name := value.get("name"), str) and name:
        return ("tool", name), parallel
    raise _refuse("tool_choice", 'must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}')


def _user(metadata: Any, dropped: list[str]) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise _refuse("metadata", "must be an object")
    dropped += [f"metadata.{key}" for key in metadata if key != "user_id"]
    user = metadata.get("user_id")
    return user if isinstance(user, str) and user else None


def _unread(body: Mapping[str, Any]) -> Iterator[str]:
    """The fields of the request that stay behind; a 400 for those that would change the answer."""
    for key, value in body.items():
        if key in READ or value is None or value == {"type": "disabled"}:  # thinking turned off loses nothing
            continue
        if key == "mcp_servers":
            raise _refuse(key, "Anthropic's MCP connector runs on Anthropic's side: an upstream of another API "
                               "cannot reach these servers")
        if key == "output_config" and isinstance(value, Mapping) and value.get("format") is not None:
            raise _refuse("output_config.format", "a structured output format cannot be said to an upstream of "
                                                  "another API")
        yield key


def _list(body: Mapping[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if value is not None and not isinstance(value, list):
        raise _refuse(key, "must be a list")
    return value or []


def read_request(body: Mapping[str, Any]) -> Request:
    """A Messages request as the neutral request."""
    if not isinstance(body, Mapping):
        raise BadRequest("a Messages request is a JSON object")
    model = _typed(body, "model", str, "a string")
    if not model:
        raise _refuse("model", "must be a non-empty string")
    dropped: list[str] = []
    turns = tuple(_turn(message, f"messages[{i}]", dropped) for i, message in enumerate(_list(body, "messages")))
    system = _system(body.get("system"), dropped)
    tools = tuple(_tool(spec, f"tools[{i}]", dropped) for i, spec in enumerate(_list(body, "tools")))
    choice, parallel = _tool_choice(body.get("tool_choice"))
    stop = _list(body, "stop_sequences")
    if not all(isinstance(sequence, str) for sequence in stop):
        raise _refuse("stop_sequences", "must be a list of strings")
    user = _user(body.get("metadata"), dropped)
    dropped += _unread(body)
    stream = _typed(body, "stream", bool, "true or false") is True
    temperature, top_p = (_typed(body, key, (int, float), "a number") for key in ("temperature", "top_p"))
    return Request(model, system, turns, tools, choice, parallel, _typed(body, "max_tokens", int, "an integer"),
                   None if temperature is None else float(temperature), None if top_p is None else float(top_p),
                   tuple(stop), stream, stream_usage=stream,  # a Messages stream always tells its usage
                   user=user, dropped=tuple(dict.fromkeys(dropped)))


# --- writing -----------------------------------------------------------------------------------------

def _blocks(turn: Turn, dropped: list[str]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in turn.parts:
        if isinstance(part, Text):
            blocks += [{"type": "text", "text": part.text}] if part.text else []  # Anthropic refuses empty text
        elif isinstance(part, Image):
            blocks.append(image_block(part))
        elif isinstance(part, Thinking):
            if part.redacted or part.signature:
                blocks.append(thinking_block(part))
            else:  # Anthropic takes back only the thinking it signed
                dropped.append("thinking")
        elif isinstance(part, ToolCall):
            block, said = tool_use_block(part)
            blocks.append(block)
            dropped += [] if said else ["tool_use.input"]
        else:
            blocks.append(_result_block(part))
    return blocks


def _result_block(result: ToolResult) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": anthropic_call_id(result.call_id)}
    content = [image_block(part) if isinstance(part, Image) else {"type": "text", "text": part.text}
               for part in result.content if isinstance(part, Image) or part.text]
    if content:
        block["content"] = content
    if result.is_error:
        block["is_error"] = True
    return block


def _messages(turns: tuple[Turn, ...], dropped: list[str]) -> list[dict[str, Any]]:
    """Turns as alternating messages: a turn with nothing to say is left out, consecutive turns of
    one role are one message, and tool results come first in theirs (as Anthropic requires)."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        blocks = _blocks(turn, dropped)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == turn.role:
            messages[-1]["content"] += blocks
        else:
            messages.append({"role": turn.role, "content": blocks})
    for message in messages:
        content = message["content"]
        message["content"] = [b for b in content if b["type"] == "tool_result"] + \
                             [b for b in content if b["type"] != "tool_result"]
    return messages


def _choice_block(request: Request) -> dict[str, Any] | None:
    choice = request.tool_choice
    if choice is None and request.parallel_tool_calls is not False:
        return None
    if isinstance(choice, tuple):
        said: dict[str, Any] = {"type": "tool", "name": choice[1]}
    else:
        said = {"type": {"required": "any", None: "auto"}.get(choice, choice)}
    if request.parallel_tool_calls is False and said["type"] != "none":  # `none` calls nothing: nothing to limit
        said["disable_parallel_tool_use"] = True
    return said


def write_request(request: Request) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The neutral request as a Messages request, and what of it could not be said."""
    dropped: list[str] = []
    body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens if request.max_tokens
                            is not None else DEFAULT_MAX_TOKENS, "messages": _messages(request.turns, dropped)}
    if system := SYSTEM_JOINER.join(text for text in request.system if text):
        body["system"] = system
    if request.tools:
        body["tools"] = [{"name": tool.name, **({"description": tool.description} if tool.description is not None
                                                else {}), "input_schema": _schema(tool.parameters)}
                         for tool in request.tools]
    if (choice := _choice_block(request)) is not None:
        body["tool_choice"] = choice
    for key, value in (("temperature", request.temperature), ("top_p", request.top_p)):
        if value is not None:
            body[key] = value
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    if request.user is not None:
        body["metadata"] = {"user_id": request.user}
    body["stream"] = request.stream
    return body, tuple(dict.fromkeys(dropped))


def _schema(parameters: dict[str, object]) -> dict[str, object]:
    """A tool's parameters as Anthropic's input_schema, which must say it is an object (a Chat
    function without parameters says nothing)."""
    return parameters if "type" in parameters else {"type": "object", **parameters}
