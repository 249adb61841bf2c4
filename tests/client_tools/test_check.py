"""The parse step for client tool calls: the gateway tools' contract and words, bounded, cached."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client_tools import check as client_calls
from gateway.client_tools.check import MAX_CHECKED_VALUES, THREAD_GRACE_SECONDS, ClientCheck, ClientTools, SchemaCache
from gateway.demo.model import Reply
from gateway.tools import Rejection, Tool, ToolContext, ToolExecutor, ToolRegistry
from gateway.tools.hooks import ToolCall, Turn
from gateway.tools.schema_bounds import INLINE, OFF_LOOP
from gateway.tools.threads import ToolThreads
from telemetry import names
from tests.conftest import USER, StackFactory, page_text, tool_outcomes

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
                   "mode": {"type": "string", "enum": ["text", "bytes"]}},
    "required": ["path"]}


def chat_tool(name: str, schema: Any = SCHEMA) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "d", "parameters": schema}}


def responses_tool(name: str, schema: Any = SCHEMA) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": "d", "parameters": schema, "strict": False}


def tools(*declared: dict[str, Any], cache: SchemaCache | None = None, **limits: int) -> ClientTools:
    return ClientTools(list(declared), cache if cache is not None else SchemaCache(), **limits)


async def gateway_parse(name: str, schema: dict[str, Any], arguments: str) -> Rejection:
    """The same call through a gateway tool declared with the same schema (as an MCP tool is)."""
    tool = Tool(name=name, parameters_schema=schema, validate_schema=True, function=lambda args: "")
    parsed = await tool.parse_arguments(arguments, ToolContext(tool_call_id="call_1"))
    assert isinstance(parsed, Rejection)
    return parsed


def assert_same(check: ClientCheck, rejection: Rejection) -> None:
    assert check.outcome == "rejected"
    assert check.rejection is not None
    assert (check.reason, check.message, check.names) == (rejection.reason, rejection.message, rejection.names)


@pytest.mark.parametrize("declare", [chat_tool, responses_tool])
def test_a_call_that_fits_is_ok(declare: Any) -> None:
    check = tools(declare("read_file")).check("read_file", '{"path": "a.py", "offset": 3, "mode": "text"}')
    assert check == ClientCheck("ok")
    assert (check.reason, check.message, check.missing, check.unrecognized, check.suggestions) == (
        None, None, (), (), ())


@pytest.mark.parametrize("declare", [chat_tool, responses_tool])
async def test_a_renamed_argument_is_missing_with_did_you_mean_in_the_gateway_tools_words(declare: Any) -> None:
    arguments = '{"file_path": "a.py"}'
    check = tools(declare("read_file")).check("read_file", arguments)
    assert check.reason == "missing_arguments"
    assert check.message is not None
    assert "Unrecognized: file_path (did you mean 'path'?)" in check.message
    assert "Accepted parameters: path, offset, mode" in check.message
    assert (check.missing, check.unrecognized, check.suggestions) == (("path",), ("file_path",),
                                                                      (("file_path", "path"),))
    assert_same(check, await gateway_parse("read_file", SCHEMA, arguments))


@pytest.mark.parametrize("arguments", ['{"path": "a.py"', "[1, 2]", '"a.py"', '{"a": ' * 70 + "1" + "}" * 70])
async def test_arguments_that_are_not_a_json_object_are_invalid_json(arguments: str) -> None:
    check = tools(chat_tool("read_file")).check("read_file", arguments)
    assert check.reason == "invalid_json"
    assert_same(check, await gateway_parse("read_file", SCHEMA, arguments))


@pytest.mark.parametrize("arguments", ['{"path": 7}', '{"path": "a", "mode": "lines"}', '{"path": "a", "offset": -1}',
                                       '{"path": "a", "extra": 1}', '{"offset": "x"}'])
async def test_type_enum_and_name_violations_read_as_the_gateway_tools_do(arguments: str) -> None:
    check = tools(chat_tool("read_file")).check("read_file", arguments)
    assert_same(check, await gateway_parse("read_file", SCHEMA, arguments))


def test_an_enum_violation_is_a_schema_violation_naming_the_field() -> None:
    check = tools(chat_tool("read_file")).check("read_file", '{"path": "a", "mode": "lines"}')
    assert check.reason == "schema_violation"
    assert check.message is not None
    assert check.message.splitlines()[:2] == ["Tool 'read_file': 1 argument does not fit the declared parameters.",
                                              "- mode: 'lines' is not one of ['text', 'bytes']"]


def test_declared_formats_are_checked() -> None:
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                               "who": {"type": "string", "format": "email"},
                                               "url": {"type": "string", "format": "uri"}}}
    client = tools(chat_tool("book", schema))
    assert client.check("book", '{"when": "2026-12-03", "who": "a@b.c", "url": "not checked"}').outcome == "ok"
    check = client.check("book", '{"when": "tomorrow", "who": "nobody"}')
    assert check.reason == "schema_violation"
    assert check.message is not None
    assert "- when: 'tomorrow' is not a 'date'" in check.message
    assert "- who: 'nobody' is not a 'email'" in check.message


def test_a_call_of_an_undeclared_tool_is_rejected_as_the_executor_rejects_one() -> None:
    check = tools(chat_tool("read_file"), chat_tool("grep")).check("read_fle", "{}")
    assert check.reason == "unknown_tool"
    assert check.message == ("There is no tool named 'read_fle'. Did you mean 'read_file'? "
                             "Available tools: read_file, grep.")


async def test_the_undeclared_tool_wording_is_the_executors() -> None:
    registry = ToolRegistry()
    for name in ("read_file", "grep"):
        registry.register(Tool(name=name, function=lambda args: ""))
    async with ToolExecutor(registry) as executor:
        [outcome] = await executor.run_turn([ToolCall(id="c1", name="read_fle", arguments="{}")], Turn())
    check = tools(chat_tool("read_file"), chat_tool("grep")).check("read_fle", "{}")
    assert outcome.rejection is not None
    assert (check.reason, check.message) == (outcome.rejection.reason, outcome.rejection.message)


def test_an_oversize_schema_is_not_checked() -> None:
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(20)}}
    client = tools(chat_tool("big", big), chat_tool("small"), max_schema_bytes=2000)
    assert client.check("big", '{"nothing": 1}') == ClientCheck("unchecked", unchecked="schema_too_large")
    assert client.check("small", '{"nothing": 1}').outcome == "rejected"


def test_tools_past_the_limit_are_not_checked() -> None:
    client = tools(*(chat_tool(f"t{i}") for i in range(5)), max_tools=3)
    assert [client.check(f"t{i}", "{}").outcome for i in range(5)] == ["rejected"] * 3 + ["unchecked"] * 2
    assert client.check("t4", "{}").unchecked == "too_many_tools"


@pytest.mark.parametrize("schema", [{"type": "object", "properties": {"a": {"type": "no-such-type"}}},
                                    {"type": "object", "required": "a"}, {"type": "string"}, [1], "x",
                                    {"type": "object", "properties": []}])
def test_a_schema_that_is_not_json_schema_of_an_object_is_not_checked(schema: Any) -> None:
    cache = SchemaCache()
    client = tools(chat_tool("odd", schema), cache=cache)
    assert client.check("odd", '{"a": 1}') == ClientCheck("unchecked", unchecked="invalid_schema")
    assert client.check("odd", "{}").outcome == "unchecked"
    assert tools(chat_tool("odd", schema), cache=cache).check("odd", "{}").unchecked == "invalid_schema"
    assert (cache.compiles, cache.hits) == (1, 1)  # kept as not checkable: not tried again


def test_other_tool_types_are_not_checked_and_not_unknown() -> None:
    client = tools({"type": "custom", "custom": {"name": "apply_patch"}}, {"type": "web_search"},
                   {"type": "function", "function": {"name": "no_args"}})
    assert client.check("apply_patch", "*** Begin Patch") == ClientCheck("unchecked", unchecked="not_a_function")
    assert client.check("no_args", "").outcome == "ok"  # no parameters: takes no arguments, any names unknown
    assert client.names == ("apply_patch", "no_args")


def test_anthropic_tools_are_read_too() -> None:
    client = tools({"name": "read_file", "description": "d", "input_schema": SCHEMA})
    assert client.check("read_file", '{"path": "a"}').outcome == "ok"
    assert client.check("read_file", '{"file": "a"}').reason == "missing_arguments"


def test_the_same_schema_is_compiled_once_across_requests_and_shapes() -> None:
    cache = SchemaCache()
    for declared in (chat_tool("read_file"), responses_tool("read_file"), chat_tool("other")):
        client = ClientTools([declared], cache)
        name = client.names[0]
        assert client.check(name, '{"path": "a"}').outcome == "ok"
        assert client.check(name, '{"path": 1}').outcome == "rejected"  # compiled once per request
    assert (cache.compiles, cache.hits, len(cache)) == (1, 2, 1)


def test_a_schema_in_another_order_is_its_own_entry() -> None:
    """The diagnostic lists the names as the request declares them."""
    cache = SchemaCache()
    reordered = {**SCHEMA, "properties": dict(reversed(list(SCHEMA["properties"].items())))}
    messages = [tools(chat_tool("t", schema), cache=cache).check("t", "{}").message for schema in (SCHEMA, reordered)]
    assert [m.splitlines()[-2] for m in messages if m] == ["Accepted parameters: path, offset, mode",
                                                           "Accepted parameters: mode, offset, path"]
    assert cache.compiles == 2


def test_the_cache_keeps_the_most_recently_used() -> None:
    cache = SchemaCache(size=2)
    schemas = [{"type": "object", "properties": {name: {"type": "string"}}} for name in ("a", "b", "c")]
    for schema in (schemas[0], schemas[1], schemas[0], schemas[2], schemas[0], schemas[1]):
        assert tools(chat_tool("t", schema), cache=cache).check("t", "{}").outcome == "ok"
    assert (cache.compiles, cache.hits, len(cache)) == (4, 2, 2)  # b was dropped for c, then compiled again


def test_the_request_schema_is_not_kept() -> None:
    schema = json.loads(json.dumps(SCHEMA))
    cache = SchemaCache()
    tools(chat_tool("read_file", schema), cache=cache).check("read_file", "{}")
    schema["required"] = []  # the request's dicts changing later does not change the cached schema
    assert tools(chat_tool("read_file", SCHEMA), cache=cache).check("read_file", "{}").reason == "missing_arguments"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) |  # as orjson reads a request
    st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
schema_words = st.sampled_from(["type", "properties", "required", "enum", "items", "format", "$ref", "$schema",
                                "additionalProperties", "patternProperties", "anyOf", "minimum", "pattern"])
schemas = st.recursive(
    json_values,
    lambda inner: st.dictionaries(schema_words | st.text(max_size=4), inner, max_size=5),
    max_leaves=25)
fields = st.sampled_from(["path", "mode", "offset", "x"])
property_schemas = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "integer", "object", "array", "boolean", "null"])},
    optional={"enum": st.lists(json_values, min_size=1, max_size=3),
              "format": st.sampled_from(["date", "email", "uuid"]), "minimum": st.integers(-(2**63), 2**63 - 1),
              "items": st.just({"type": "string"})})
object_schemas = st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(fields, property_schemas, max_size=4)},
    optional={"required": st.lists(fields, max_size=3, unique=True), "additionalProperties": st.booleans()})
named_values = st.dictionaries(fields, json_values)
argument_texts = st.one_of(st.text(max_size=40), json_values.map(json.dumps), named_values.map(json.dumps),
                           named_values.map(json.dumps).map(lambda text: text[:-1]))


tool_names = st.sampled_from(["a", "b", "t"])
declarations = st.one_of(json_values, st.builds(chat_tool, tool_names, schemas),
                         st.builds(responses_tool, tool_names, schemas),
                         st.builds(chat_tool, tool_names, object_schemas))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(declared=st.lists(declarations, max_size=4), name=st.text(max_size=10),
       arguments=st.one_of(st.none(), argument_texts))
def test_the_check_never_raises(declared: list[Any], name: str, arguments: str | None) -> None:
    client = ClientTools(declared, SchemaCache(size=2), max_tools=3)
    for candidate in (name, *client.names):
        check = client.check(candidate, arguments)
        assert check.outcome in ("ok", "rejected", "unchecked")
        assert (check.outcome == "rejected") == (check.rejection is not None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=object_schemas, arguments=st.one_of(argument_texts, named_values.map(json.dumps)))
def test_a_checked_call_comes_out_as_a_gateway_tools_parse_step(schema: dict[str, Any], arguments: str) -> None:
    """Formats aside (the gateway's own tools check none), the client check is the gateway's."""
    schema = {**schema, "properties": {name: {k: v for k, v in prop.items() if k != "format"}
                                       for name, prop in schema["properties"].items()}}
    tool = Tool(name="t", parameters_schema=schema, validate_schema=True, function=lambda args: "")
    parsed = asyncio.run(tool.parse_arguments(arguments, ToolContext(tool_call_id="c")))
    check = tools(chat_tool("t", schema)).check("t", arguments)
    if isinstance(parsed, Rejection):
        assert_same(check, parsed)
    else:
        assert check.outcome == "ok"


# --- issue 53: a declared schema is data, checked at a bounded cost ---------------------------------------

OUTSIDE = "http://127.0.0.1:9"  # the discard port: nothing should ever try it


@contextlib.contextmanager
def no_connection() -> Iterator[list[Any]]:
    """Every connection attempted inside (each refused), for the test to find empty."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        attempts.append(args)
        raise OSError("the test forbids connections")

    with mock.patch.object(socket.socket, "connect", refuse), mock.patch("socket.create_connection", refuse):
        yield attempts


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"path": {"$ref": f"{OUTSIDE}/path.json"}}},
    {"$id": f"{OUTSIDE}/tool.json", "type": "object", "properties": {"path": {"$ref": "path.json"}}},
    {"type": "object", "properties": {"path": {"$dynamicRef": f"{OUTSIDE}/path.json#meta"}}},
], ids=["ref_to_url", "id_and_relative_ref", "dynamic_ref"])
def test_a_schema_referring_outside_itself_is_unchecked_and_nothing_is_fetched(schema: dict[str, Any]) -> None:
    with no_connection() as attempts:
        check = tools(chat_tool("open", schema)).check("open", '{"path": 7}')
    assert check == ClientCheck("unchecked", unchecked="remote_ref")
    assert attempts == []


def fan_out(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
                            for i in range(levels)}
    defs[f"l{levels}"] = {"type": "string"}
    return {"type": "object", "$defs": defs, "properties": {"q": {"$ref": "#/$defs/l0"}}}


async def test_past_the_inline_budget_a_check_is_made_off_the_loop_and_its_schema_kept() -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}}
    arguments = json.dumps({"xs": [*range(3_000), "three thousand"]})
    cache = SchemaCache()
    threads = ToolThreads(1)
    try:
        loop_thread = threading.get_ident()
        with mock.patch("gateway.client_tools.check._check_fully", wraps=client_calls._check_fully) as off_loop:
            check = await tools(chat_tool("t", schema), cache=cache).check_bounded("t", arguments, threads)
        assert off_loop.call_count == 1
        assert check.reason == "schema_violation"
        assert check.message is not None
        assert "- xs.3000: 'three thousand' is not of type 'integer'" in check.message
        assert tools(chat_tool("t", schema), cache=cache).check("t", arguments) == check  # the same, all here
        assert (cache.compiles, cache.hits) == (1, 1)  # compiled on the loop, within its budget, and kept
        fanned = await tools(chat_tool("f", fan_out(30)), cache=cache).check_bounded("f", '{"q": "x"}', threads)
        assert fanned == ClientCheck("unchecked", unchecked="too_complex")
        assert len(cache) == 2  # compiled off the loop (past the inline budget), and kept too
        assert tools(chat_tool("f", fan_out(30)), cache=cache).check("f", '{"q": "x"}') == fanned
        assert cache.hits == 2
        assert threading.get_ident() == loop_thread
    finally:
        threads.close()


def test_arguments_holding_more_values_than_are_checked_are_not_read() -> None:
    schema = {"type": "object", "properties": {"rows": {"type": "array", "uniqueItems": True}}}
    arguments = json.dumps({"rows": list(range(MAX_CHECKED_VALUES + 1))})
    with mock.patch("gateway.client_tools.check.read_arguments") as read:
        check = tools(chat_tool("t", schema)).check("t", arguments)
    assert check == ClientCheck("unchecked", unchecked="too_complex")
    read.assert_not_called()
    assert tools(chat_tool("t", schema)).check("t", json.dumps({"rows": [0, 1, 1]})).reason == "schema_violation"


OUTSIDE_REFERENCES = [f"{OUTSIDE}/s.json", "s.json", "other.json#/x", "https://json-schema.org/draft/2020-12/schema"]
references = st.sampled_from(["#", "#/$defs/a", "#/$defs/b", "#/properties/x", "#a", "#meta", "#/$defs/none",
                              *OUTSIDE_REFERENCES])
ids = st.sampled_from([f"{OUTSIDE}/root.json", "sub.json", "https://tools.example/t.json", "urn:example:t"])
leaf_schemas = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["string", "integer", "array", "object", "number"]),
    "pattern": st.sampled_from(["^(a+)+$", "^(a|a)*$", "[0-9]{3}"]),
    "uniqueItems": st.booleans(), "enum": st.lists(json_values, min_size=1, max_size=3),
    "minimum": st.integers(-5, 5), "$anchor": st.just("a"), "$dynamicAnchor": st.just("meta"),
    "format": st.sampled_from(["email", "date-time", "uuid"])})


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries({"$ref": references}), st.fixed_dictionaries({"$dynamicRef": references}),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner}, optional={"uniqueItems": st.booleans()}),
        st.fixed_dictionaries({"properties": st.dictionaries(fields, inner, max_size=3)},
                              optional={"patternProperties": st.just({"^(a+)+$": {"type": "string"}}),
                                        "additionalProperties": st.booleans()}),
        st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"$id": ids, "items": inner}))


subschemas = st.recursive(leaf_schemas | st.booleans(), _nested, max_leaves=10)
hostile_schemas = st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(fields, subschemas, max_size=3)},
    optional={"$id": ids, "$defs": st.fixed_dictionaries({"a": subschemas, "b": subschemas}),
              "required": st.lists(fields, max_size=2, unique=True),
              "$schema": st.sampled_from(["https://json-schema.org/draft/2020-12/schema",
                                          "http://json-schema.org/draft-07/schema#",
                                          "http://json-schema.org/draft-04/schema#"])})
hostile_values = st.one_of(json_values, st.just("a" * 40 + "!"),
                           st.lists(st.sampled_from([{"a": 1}, {"a": 1.0}, [1], "a", 1, True]), max_size=30))
hostile_arguments = st.one_of(st.dictionaries(fields, hostile_values, max_size=4).map(json.dumps), argument_texts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=hostile_schemas, arguments=hostile_arguments)
def test_any_schema_is_checked_within_its_budget_without_raising_or_connecting(schema: dict[str, Any],
                                                                               arguments: str) -> None:
    """References in and out of the schema ($ref, $id, $dynamicRef), patterns made to backtrack,
    uniqueItems, nesting: on the loop and off it, the check ends within its budget, and nothing
    is ever fetched."""
    threads = ToolThreads(2)
    with no_connection() as attempts:
        try:
            started = time.monotonic()
            bounded = asyncio.run(ClientTools([chat_tool("t", schema)], SchemaCache()).check_bounded(
                "t", arguments, threads))
            elapsed = time.monotonic() - started
            here = ClientTools([chat_tool("t", schema)], SchemaCache()).check("t", arguments)
        finally:
            threads.close()
    assert attempts == []
    assert elapsed < INLINE.seconds + OFF_LOOP.seconds + THREAD_GRACE_SECONDS
    assert bounded.outcome in ("ok", "rejected", "unchecked")
    assert (bounded.outcome == "rejected") == (bounded.rejection is not None)
    assert (here.outcome, here.reason, here.unchecked) == (bounded.outcome, bounded.reason, bounded.unchecked)
    if refers_outside(schema):
        assert bounded.unchecked in ("remote_ref", "invalid_schema", "too_complex")


def refers_outside(schema: Any) -> bool:
    """Whether a check applies a reference outside the schema (`$defs` left out: a draft before
    2019-09 knows no such keyword, and never looks inside it unless referred to)."""
    if isinstance(schema, list):
        return any(refers_outside(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    return (schema.get("$ref") in OUTSIDE_REFERENCES or schema.get("$dynamicRef") in OUTSIDE_REFERENCES
            or any(refers_outside(value) for key, value in schema.items() if key != "$defs"))


async def test_a_client_schemas_pattern_is_not_checked_and_the_docs_say_so(make_stack: StackFactory) -> None:
    """Even in reject mode a value that breaks `pattern` reaches the client (a hostile pattern would
    hold the event loop), and the client's tools section of the docs says so."""
    stack = await make_stack(client_tool_check="reject")
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"}},
              "required": ["code"], "additionalProperties": False}
    stack.script.then(Reply(tool_calls=[("lookup", {"code": "not digits"})]))
    answer = await stack.ask(False, messages=USER, tools=[{"type": "function", "function": {
        "name": "lookup", "description": "d", "parameters": schema}}])
    assert [call["function"]["arguments"] for call in answer.tool_calls] == ['{"code": "not digits"}']
    assert tool_outcomes(stack, answer.headers["x-trace-id"], side=names.SIDE_CLIENT) == [("lookup", "ok")]
    section = page_text().split("### The client's own tools", 1)[1].split("## ", 1)[0]
    assert "Regular expressions are not checked: a value that breaks a `pattern` passes" in section
