"""Rules the built-in model answers by."""

from __future__ import annotations

import json
import re
from collections.abc import Container
from typing import Any

from gateway.demo.model import Reply

_HINT = re.compile(r"(\w+) \(did you mean '(\w+)'\?\)")
_CITY = re.compile(r"\bin ([A-Z][a-zA-Z-]+)")
# A question the weather story answers: any other goes to the user's own tools, or is echoed.
_ABOUT_WEATHER = re.compile(r"\b(?:weather|forecast|temperature)\b", re.IGNORECASE)


def _offered(body: dict[str, Any]) -> set[str]:
    tools = body.get("tools") or []
    return {t["function"]["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)}


def _base(name: str) -> str:
    """A tool's name without the prefix an MCP source gives it (`examples__get_weather`)."""
    return name.rpartition("__")[2]


def _named(offered: set[str], base: str) -> str | None:
    """The offered name of the tool called `base`, with or without an MCP source's prefix."""
    return next((name for name in sorted(offered) if _base(name) == base), None)


def _since_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return messages[last_user + 1:]


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _question(messages: list[dict[str, Any]]) -> str:
    """The text of the user's last message."""
    return next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")


def _calls_and_results(turns: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """(tool name, arguments, result text) for each call answered since the user spoke."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    out = []
    for message in turns:
        for call in message.get("tool_calls") or []:
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
            except ValueError:
                arguments = {}
            calls[call["id"]] = (call["function"]["name"], arguments if isinstance(arguments, dict) else {})
        if message.get("role") == "tool" and message.get("tool_call_id") in calls:
            name, arguments = calls[message["tool_call_id"]]
            out.append((name, arguments, _text(message.get("content"))))
    return out


def _succeeded(result: str) -> Any:
    try:
        return json.loads(result)
    except ValueError:
        return None


def _weather(value: Any) -> dict[str, Any] | None:
    """A get_weather result, when it is one (a caller's history may hold anything)."""
    keys = {"city", "temperature", "unit", "conditions"}
    return value if isinstance(value, dict) and keys <= value.keys() and isinstance(value["unit"], str) else None


STORY_TOOLS = ("get_weather", "to_fahrenheit")  # the weather story's, whoever runs them
DEMO_TOOLS = (*STORY_TOOLS, "echo")  # the example tools (gateway.demo.tools), which are no user's own
QUOTED_CHARS = 500  # of a client tool's result, in the answer that quotes it


def _example(schema: Any, question: str) -> Any:
    """A value that fits a JSON Schema: its default, its first enum value, else by type (a string
    is the user's question; an object has its required properties, each filled the same way)."""
    if not isinstance(schema, dict):
        return question
    if "default" in schema:
        return schema["default"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
    if kind == "object" or "properties" in schema:
        properties: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        required = [name for name in schema.get("required") or [] if isinstance(name, str)]
        return {name: _example(properties.get(name), question) for name in required}
    return {"integer": 1, "number": 1, "boolean": True, "array": [], "null": None}.get(str(kind), question)


class DemoPolicy:
    """An agent that, asked about the weather, asks for it with a wrong argument name, reads the
    gateway's diagnostic, corrects the name, converts the temperature, and answers.

    With a tool of the client's own on offer (a function tool that is not in `gateway_tools`, the
    gateway's registry, nor one of the weather story's), it hands back instead: to the user's
    message it answers with a call of the first such tool, its required arguments made up from its
    schema (`_example`); to that tool's result, with a text quoting it. Without `gateway_tools`,
    every offered tool counts as the gateway's. To any other question than the weather (or when
    the weather story's tools are not on offer), the first of the gateway's tools that is not an
    example tool (a registry of the user's own, `toolspan serve --tools mytools:registry`, alone or
    beside the examples) is called the same way, so that a newcomer's first request runs their tool."""

    def __init__(self, gateway_tools: Container[str] | None = None) -> None:
        self.gateway_tools = gateway_tools

    def _client_tools(self, body: dict[str, Any], question: str) -> list[tuple[str, Any]]:
        """(name, parameters) of the tools to call in the request's order: the client's own on
        offer; else none for a weather question while get_weather is on offer (the weather story);
        else the gateway's that are not example tools; else, when the weather story's are not on
        offer, the gateway's."""
        if self.gateway_tools is None or body.get("tool_choice") == "none":
            return []
        functions = [(f["name"], f.get("parameters")) for t in body.get("tools") or []
                     if isinstance(t, dict) and isinstance(f := t.get("function"), dict)
                     and isinstance(f.get("name"), str)]
        clients = [(name, p) for name, p in functions if name not in self.gateway_tools
                   and _base(name) not in STORY_TOOLS]
        if clients:
            return clients
        if _ABOUT_WEATHER.search(question) and any(_base(name) == "get_weather" for name, _ in functions):
            return []
        users = [(name, p) for name, p in functions if _base(name) not in DEMO_TOOLS]
        if users or any(_base(name) in STORY_TOOLS for name, _ in functions):
            return users
        return functions

    def _hand_back(self, body: dict[str, Any], messages: list[dict[str, Any]],
                   turns: list[dict[str, Any]]) -> Reply | None:
        client = self._client_tools(body, _question(messages))
        if not client:
            return None
        names = {name for name, _ in client}
        answered = [(name, result) for name, _, result in _calls_and_results(turns) if name in names]
        if answered:
            name, result = answered[-1]
            quoted = result if len(result) <= QUOTED_CHARS else result[:QUOTED_CHARS] + "..."
            return Reply(content=f"(scripted model) Your tool {name} answered: {quoted}")
        if messages and messages[-1].get("role") == "user":
            name, parameters = client[0]
            question = _question(messages)[:200]
            arguments = _example(parameters or {"type": "object"}, question)
            return Reply(tool_calls=[(name, arguments if isinstance(arguments, dict) else {})])
        return None

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        offered = _offered(body)
        turns = _since_user(messages)
        if (handed := self._hand_back(body, messages, turns)) is not None:
            return handed
        weather_tool, fahrenheit_tool = _named(offered, "get_weather"), _named(offered, "to_fahrenheit")
        if body.get("tool_choice") == "none" or weather_tool is None or not _ABOUT_WEATHER.search(_question(messages)):
            return Reply(content=self._answer(messages, turns))
        history = _calls_and_results(turns)
        if history:
            name, arguments, result = history[-1]
            renames = dict(_HINT.findall(result))
            if renames:
                fixed = {renames.get(key, key): value for key, value in arguments.items()}
                return Reply(tool_calls=[(name, fixed)])
        done = {_base(name): value for name, _, result in history if (value := _succeeded(result)) is not None}
        if "get_weather" not in done:
            city = match.group(1) if (match := _CITY.search(_question(messages))) else "Paris"
            return Reply(tool_calls=[(weather_tool, {"city_name": city})])  # the wrong name, on purpose
        weather = _weather(done["get_weather"])
        if (weather is not None and fahrenheit_tool is not None and "to_fahrenheit" not in done
                and weather["unit"] == "celsius"):
            return Reply(tool_calls=[(fahrenheit_tool, {"celsius": weather["temperature"]})])
        return Reply(content=self._answer(messages, turns))

    @staticmethod
    def _answer(messages: list[dict[str, Any]], turns: list[dict[str, Any]]) -> str:
        done = {_base(name): value for name, _, result in _calls_and_results(turns)
                if (value := _succeeded(result)) is not None}
        weather = _weather(done.get("get_weather"))
        if weather is not None:
            fahrenheit = done.get("to_fahrenheit")
            extra = f" ({fahrenheit} °F)" if fahrenheit is not None else ""
            return (f"In {weather['city']} it is {weather['temperature']} °{weather['unit'][:1].upper()}{extra} "
                    f"with {weather['conditions']}.")
        return f"(scripted model) You said: {_question(messages)[:200]}"


class FastPolicy:
    """The cheapest possible model, for benchmarks: answers at once, or makes one `echo` call
    when asked to use a tool, or a mixed turn (`echo` and the client's `ask_human`) when asked to
    ask."""

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return Reply(content="done")
        if {"echo", "ask_human"} <= _offered(body) and "ask me" in _text(last.get("content")):
            return Reply(tool_calls=[("echo", {"text": "hi"}), ("ask_human", {})])
        if "echo" in _offered(body) and "use a tool" in _text(last.get("content")):
            return Reply(tool_calls=[("echo", {"text": "hi"})])
        return Reply(content="ok")
