"""ToolRegistry: register, look up, and describe tools to the provider."""

from typing import Any

import pytest

from gateway.apis.chat import CHAT
from gateway.apis.responses import RESPONSES
from gateway.tools import Param, Tool, ToolDeclarationError, ToolRegistry, tool

READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
CALC_SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}, "precision": {"type": "integer"}},
               "required": ["expression"]}
STRICT_CALC_SCHEMA = {"type": "object",  # strict mode: every property required, the optional one nullable
                      "properties": {"expression": {"type": "string"}, "precision": {"type": ["integer", "null"]}},
                      "required": ["expression", "precision"], "additionalProperties": False}


def echo(args: dict[str, Any]) -> str:
    return str(args)


def make(name: str, **kwargs: Any) -> Tool:
    kwargs.setdefault("description", f"The {name} tool")
    return Tool(name=name, function=echo, **kwargs)


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry([
        make("read_file", parameters=[Param("path", "string", required=True)]),
        make("calculator", parameters_schema=CALC_SCHEMA, strict=True),
        make("ping"),
    ])


def test_register_returns_the_tool_and_keeps_registration_order() -> None:
    reg = ToolRegistry()
    first, second = make("b"), make("a")
    assert reg.register(first) is first
    assert reg.register(second) is second
    assert reg.names() == ["b", "a"]
    assert list(reg) == [first, second]


def test_register_works_as_a_decorator_on_tool_results() -> None:
    reg = ToolRegistry()

    @reg.register
    @tool
    def now() -> str:
        return "noon"

    assert reg.get("now") is now


def test_a_name_can_be_registered_once(registry: ToolRegistry) -> None:
    with pytest.raises(ToolDeclarationError, match="tool 'ping' is already registered"):
        registry.register(make("ping", description="another"))
    assert len(registry) == 3


def test_a_duplicate_in_the_constructor_is_an_error() -> None:
    with pytest.raises(ToolDeclarationError, match="tool 'x' is already registered"):
        ToolRegistry([make("x"), make("x")])


@pytest.mark.parametrize("thing", [echo, "ping", {"name": "ping"}])
def test_only_tools_can_be_registered(thing: Any) -> None:
    with pytest.raises(ToolDeclarationError, match="only Tool objects can be registered"):
        ToolRegistry().register(thing)


def test_get(registry: ToolRegistry) -> None:
    found = registry.get("calculator")
    assert found is not None
    assert found.name == "calculator"
    assert registry.get("Calculator") is None
    assert registry.get("nope") is None


def test_names_iteration_len_and_contains(registry: ToolRegistry) -> None:
    assert registry.names() == ["read_file", "calculator", "ping"]
    assert [t.name for t in registry] == registry.names()
    assert len(registry) == 3
    assert "ping" in registry
    assert "pong" not in registry
    assert len(ToolRegistry()) == 0


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        pytest.param(lambda reg: reg.get("ping"), True, id="the-registered-tool"),
        pytest.param(lambda reg: make("ping"), False, id="another-tool-of-that-name"),
        pytest.param(lambda reg: make("pong"), False, id="an-unregistered-tool"),
        pytest.param(lambda reg: 3, False, id="not-a-name"),
        pytest.param(lambda reg: ["ping"], False, id="unhashable"),
    ],
)
def test_contains_takes_tools_and_odd_values_without_raising(registry: ToolRegistry, item: Any,
                                                             expected: bool) -> None:
    assert (item(registry) in registry) is expected


def test_openai_tools_use_the_chat_completions_shape(registry: ToolRegistry) -> None:
    assert registry.specs("chat", CHAT.tool_spec) == [
        {"type": "function", "function": {
            "name": "read_file", "description": "The read_file tool",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
        {"type": "function", "function": {
            "name": "calculator", "description": "The calculator tool",
            "parameters": STRICT_CALC_SCHEMA, "strict": True}},
        {"type": "function", "function": {
            "name": "ping", "description": "The ping tool", "parameters": {"type": "object", "properties": {}}}},
    ]


def test_responses_tools_use_the_flat_shape(registry: ToolRegistry) -> None:
    assert registry.specs("responses", RESPONSES.tool_spec) == [
        {"type": "function", "name": "read_file", "description": "The read_file tool",
         "parameters": READ_SCHEMA, "strict": False},
        {"type": "function", "name": "calculator", "description": "The calculator tool",
         "parameters": STRICT_CALC_SCHEMA, "strict": True},
        {"type": "function", "name": "ping", "description": "The ping tool",
         "parameters": {"type": "object", "properties": {}}, "strict": False},
    ]


@pytest.mark.parametrize(
    ("allowed", "names"),
    [
        (None, ["read_file", "calculator", "ping"]),
        ({"ping", "read_file"}, ["read_file", "ping"]),  # registry order, not the allowlist's
        (["calculator", "unknown"], ["calculator"]),
        ([], []),
    ],
)
def test_allowed_filters_both_shapes(registry: ToolRegistry, allowed: Any, names: list[str]) -> None:
    assert [spec["function"]["name"] for spec in registry.specs("chat", CHAT.tool_spec, allowed)] == names
    assert [spec["name"] for spec in registry.specs("responses", RESPONSES.tool_spec, allowed)] == names


def test_tools_offered_on_request_are_kept_but_never_offered(registry: ToolRegistry) -> None:
    registry.replace_source("mcp:own", [make("own__list")])
    registry.replace_source("mcp:files", [make("files__read", approval=True), make("files__write")],
                            on_request=True)

    assert [t.name for t in registry.tools_of("mcp:files")] == ["files__read", "files__write"]
    assert registry.get("files__read") is not None
    assert "files__read" in registry.names()
    assert (registry.on_request("files__read"), registry.on_request("own__list"),
            registry.on_request("ping"), registry.on_request("nope")) == (True, False, False, False)
    every = {"read_file", "calculator", "ping", "own__list"}
    for allowed in (None, frozenset(every | {"files__read", "files__write"})):
        assert registry.offered_names(allowed) == every
        assert {spec["function"]["name"] for spec in registry.specs("chat", CHAT.tool_spec, allowed)} == every
        assert {spec["name"] for spec in registry.specs("responses", RESPONSES.tool_spec, allowed)} == every
        assert registry.approval_names(allowed) == frozenset()


def test_a_source_offered_on_request_stays_so_when_its_tools_change(registry: ToolRegistry) -> None:
    registry.replace_source("mcp:files", [make("files__read")], on_request=True)
    registry.offered_names()  # cached: a change must not leave the new tool offered
    registry.replace_source("mcp:files", [make("files__read"), make("files__new")], on_request=True)

    assert registry.on_request("files__new")
    assert registry.offered_names() == {"read_file", "calculator", "ping"}
    registry.replace_source("mcp:files", [])
    assert (registry.tools_of("mcp:files"), registry.on_request("files__read")) == ([], False)
