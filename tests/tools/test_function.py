"""Tool: declaration, the parse step, the execute step, and result normalisation."""

import json
import threading
from collections.abc import Callable
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gateway.demo.model import Reply
from gateway.tools import (
    Interrupt,
    Param,
    Parsed,
    Rejection,
    Tool,
    ToolContext,
    ToolDeclarationError,
    ToolError,
    ToolOutcome,
    ToolRegistry,
    ToolResult,
    accepted_param_names,
    read_arguments,
    required_param_names,
)
from telemetry import names
from tests.conftest import USER, StackFactory, hang

CTX = ToolContext(tool_call_id="call-1", trajectory_id="traj-1", request_id="req-1", principal="key-a",
                  metadata={"team": "a"})

READ_PARAMS = [Param("path", "string", required=True), Param("offset", "integer")]
OPTIONAL_READ_PARAMS = [Param("path", "string"), Param("offset", "integer")]


class Invoice(BaseModel):
    vendor_name: str
    total: float
    currency: Literal["usd", "eur"] = "usd"


class Recorder:
    """A tool body that records what it was given and returns a fixed result."""

    def __init__(self, result: Any = "done") -> None:
        self.result = result
        self.calls: list[tuple[dict[str, Any], ToolContext]] = []

    def __call__(self, args: dict[str, Any], context: ToolContext) -> Any:
        self.calls.append((args, context))
        return self.result

    @property
    def args(self) -> list[dict[str, Any]]:
        return [args for args, _ in self.calls]


def make(function: Callable[..., Any] | None = None, **kwargs: Any) -> Tool:
    return Tool(name=kwargs.pop("name", "read"), function=function or Recorder(), **kwargs)


def gives(value: Any) -> Callable[[dict[str, Any]], Any]:
    """A one-argument body or parser that returns `value`."""
    return lambda args: value


def raises(exc: BaseException) -> Callable[[dict[str, Any]], Any]:
    """A one-argument body or parser that raises `exc`."""

    def fail(args: dict[str, Any]) -> Any:
        raise exc

    return fail


def returning(value: Any) -> Tool:
    return make(gives(value))


def raising(exc: BaseException) -> Tool:
    return make(raises(exc))


# --- declaration styles -> JSON schema -----------------------------------------------------------


@pytest.mark.parametrize(
    ("declaration", "schema"),
    [
        pytest.param({"parameters": READ_PARAMS},
                     {"type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}},
                      "required": ["path"]}, id="parameters"),
        pytest.param({"parameters": READ_PARAMS, "strict": True},  # strict mode: optional means nullable
                     {"type": "object",
                      "properties": {"path": {"type": "string"}, "offset": {"type": ["integer", "null"]}},
                      "required": ["path", "offset"], "additionalProperties": False}, id="parameters-strict"),
        pytest.param({"parameters_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                                            "required": ["expression"]}},
                     {"type": "object", "properties": {"expression": {"type": "string"}},
                      "required": ["expression"]}, id="parameters_schema"),
        pytest.param({"args_model": Invoice},
                     {"type": "object", "properties": {
                         "vendor_name": {"type": "string"},
                         "total": {"type": "number"},
                         "currency": {"type": "string", "enum": ["usd", "eur"], "default": "usd"}},
                      "required": ["vendor_name", "total"]}, id="args_model"),
        pytest.param({}, {"type": "object", "properties": {}}, id="no-arguments"),
    ],
)
def test_declaration_style_gives_schema(declaration: dict[str, Any], schema: dict[str, Any]) -> None:
    assert make(**declaration).schema == schema


def test_parameters_schema_is_copied_not_shared() -> None:
    source: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    built = make(parameters_schema=source)
    source["properties"]["b"] = {"type": "integer"}
    assert list(built.schema["properties"]) == ["a"]


# --- declarations that fail when the tool is built ----------------------------------------------


def no_args() -> str:
    return ""


def three_args(a: Any, b: Any, c: Any) -> str:
    return ""


NOT_AN_OBJECT_SCHEMA = "tool 's': parameters_schema must be a JSON schema with \"type\": \"object\""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"name": "twice", "parameters": READ_PARAMS, "parameters_schema": {"type": "object"}},
                     "tool 'twice' declares its arguments twice (parameters and parameters_schema); use one",
                     id="parameters+schema"),
        pytest.param({"name": "twice", "parameters_schema": {"type": "object"}, "args_model": Invoice},
                     "tool 'twice' declares its arguments twice (parameters_schema and args_model)",
                     id="schema+model"),
        pytest.param({"name": "bad name"}, "tool name 'bad name' is invalid", id="space-in-name"),
        pytest.param({"name": "a" * 65}, f"tool name '{'a' * 65}' is invalid", id="65-char-name"),
        pytest.param({"name": ""}, "tool name '' is invalid", id="empty-name"),
        pytest.param({"name": "read\n"}, "tool name 'read\\n' is invalid", id="trailing-newline"),
        pytest.param({"name": "s", "parameters_schema": {"type": "array"}},
                     NOT_AN_OBJECT_SCHEMA, id="schema-array"),
        pytest.param({"name": "s", "parameters_schema": {"properties": {}}},
                     NOT_AN_OBJECT_SCHEMA, id="schema-untyped"),
        pytest.param({"name": "s", "parameters_schema": {"type": "object", "properties": ["a"]}},
                     "tool 's': parameters_schema properties must be an object", id="schema-properties-list"),
        pytest.param({"name": "s", "parameters_schema": {"type": "object", "properties": {"a": {"default": object()}}}},
                     "tool 's': parameters_schema is not plain JSON", id="schema-not-json"),
        pytest.param({"name": "f", "function": "not a function"}, "tool 'f': function is not callable",
                     id="uncallable"),
        pytest.param({"name": "f", "function": no_args}, "tool 'f': function must take (args) or (args, context)",
                     id="arity-0"),
        pytest.param({"name": "f", "function": three_args},
                     "tool 'f': function must take (args) or (args, context)", id="arity-3"),
        pytest.param({"name": "p", "parse_args": no_args},
                     "tool 'p': parse_args must take (args) or (args, context)", id="parser-arity-0"),
        pytest.param({"name": "t", "timeout": 0}, "tool 't': timeout must be a positive number", id="timeout-0"),
        pytest.param({"name": "t", "timeout": -1.0}, "tool 't': timeout must be a positive number", id="timeout-neg"),
        pytest.param({"name": "d", "parameters": [Param("a", "string"), Param("a", "integer")]},
                     "tool 'd' declares a parameter twice", id="duplicate-param"),
        pytest.param({"name": "d", "parameters": [{"name": "a", "type": "string"}]},
                     "tool 'd': parameters must be Param objects", id="not-a-param"),
        pytest.param({"name": "d", "parameters": [Param("a", "str")]},
                     "tool 'd': parameter 'a' has type 'str'", id="malformed-param"),
        pytest.param({"name": "m", "args_model": dict}, "tool 'm': args_model must be a pydantic model class",
                     id="model-not-pydantic"),
    ],
)
def test_bad_declarations_fail_naming_the_tool(kwargs: dict[str, Any], message: str) -> None:
    kwargs.setdefault("function", Recorder())
    with pytest.raises(ToolDeclarationError) as info:
        Tool(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["a" * 64, "get_weather", "read-file", "Z9"])
def test_valid_names_are_accepted(name: str) -> None:
    assert make(name=name).name == name


# --- required / accepted names -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declaration", "required", "accepted"),
    [
        pytest.param({"parameters": READ_PARAMS}, ["path"], ["path", "offset"], id="parameters"),
        pytest.param({"parameters": []}, [], [], id="empty-parameters"),
        pytest.param({"parameters_schema": {"type": "object", "properties": {"path": {}, "limit": {}},
                                            "required": ["path"]}},
                     ["path"], ["path", "limit"], id="parameters_schema"),
        pytest.param({"parameters_schema": {"type": "object", "required": ["path"]}}, ["path"], [],
                     id="schema-without-properties"),
        pytest.param({"parameters_schema": {"type": "object"}}, [], [], id="bare-object-schema"),
        pytest.param({"args_model": Invoice}, ["vendor_name", "total"], ["vendor_name", "total", "currency"],
                     id="args_model"),
        pytest.param({}, [], [], id="no-arguments"),
    ],
)
def test_required_and_accepted_param_names(declaration: dict[str, Any], required: list[str],
                                           accepted: list[str]) -> None:
    built = make(**declaration)
    assert required_param_names(built) == required
    assert accepted_param_names(built) == accepted


# --- decoding the raw arguments ------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["{bad", "{'path': 'a'}", '{"path": "a"', "path=a"])
async def test_invalid_json_is_rejected(raw: str) -> None:
    outcome = await make(parameters=READ_PARAMS).call(raw, CTX)
    assert outcome.status == "rejected"
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "invalid_json"
    assert outcome.content.startswith("Tool 'read': the arguments are not valid JSON (")
    assert outcome.content.endswith("Send them as one JSON object of named parameters.")


@pytest.mark.parametrize(
    ("raw", "kind"),
    [("[1, 2]", "an array"), ('"a.txt"', "a string"), ("42", "a number"), ("1.5", "a number"),
     ("null", "null"), ("true", "a boolean")],
)
async def test_json_that_is_not_an_object_is_rejected(raw: str, kind: str) -> None:
    outcome = await make(parameters=READ_PARAMS).call(raw, CTX)
    assert outcome.status == "rejected"
    assert outcome.error_type == "invalid_json"
    assert outcome.content == f"Tool 'read': the arguments must be a JSON object of named parameters, not {kind}."


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[" * 100_000, "the arguments are nested more than 64 levels deep"),
        ('{"a": ' * 100_000, "the arguments are nested more than 64 levels deep"),
        ('{"n": ' + "9" * 5000 + "}", "the arguments hold a value too large to read"),
    ],
    ids=["deep-array", "deep-object", "huge-integer"],
)
async def test_json_python_cannot_read_is_rejected_not_raised(raw: str, message: str) -> None:
    body = Recorder()
    outcome = await make(body).call(raw, CTX)
    assert (outcome.status, outcome.error_type) == ("rejected", "invalid_json")
    assert message in outcome.content
    assert body.calls == []


@pytest.mark.parametrize("raw", ["", "   ", None, {}, "{}"])
async def test_empty_arguments_mean_an_empty_object(raw: str | None) -> None:
    body = Recorder()
    outcome = await make(body).call(raw, CTX)
    assert outcome.status == "ok"
    assert body.args == [{}]


@given(st.dictionaries(st.text(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10)))
def test_decode_round_trips_any_json_object(value: dict[str, Any]) -> None:
    assert read_arguments("t", json.dumps(value)) == value


@given(st.text())
def test_decode_never_raises(raw: str) -> None:
    decoded = read_arguments("t", raw)
    assert isinstance(decoded, dict) or decoded.reason == "invalid_json"


# --- the built-in required-key check ----------------------------------------------------------


async def test_a_renamed_argument_gets_one_message_naming_missing_unrecognized_and_accepted() -> None:
    body = Recorder()
    outcome = await make(body, parameters=READ_PARAMS).call('{"file_path": "a.txt"}', CTX)
    assert outcome.status == "rejected"
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "missing_arguments"
    assert outcome.content == "\n".join([
        "Tool 'read': required arguments are missing.",
        "Required parameters: path",
        "Missing: path",
        "Unrecognized: file_path (did you mean 'path'?)",
        "Accepted parameters: path, offset",
        "Call 'read' again, passing every required parameter under its accepted name.",
    ])
    assert outcome.names is not None
    assert outcome.names.suggestions == (("file_path", "path"),)
    assert body.calls == []


async def test_an_unknown_accepted_list_prints_no_unrecognized_line() -> None:
    built = make(parameters_schema={"type": "object", "required": ["path"]})
    outcome = await built.call('{"file_path": "a.txt"}', CTX)
    assert outcome.status == "rejected"
    assert "Missing: path" in outcome.content
    assert "Unrecognized" not in outcome.content
    assert "Accepted parameters" not in outcome.content


async def test_the_check_is_presence_only() -> None:
    body = Recorder()
    built = make(body, parameters=[*READ_PARAMS, Param("unit", "string", enum=["c", "f"])])
    outcome = await built.call('{"path": 7, "unit": "kelvin", "extra": true}', CTX)
    assert outcome.status == "ok"
    assert body.args == [{"path": 7, "unit": "kelvin", "extra": True}]


# --- parse_args ----------------------------------------------------------------------------------


async def test_parser_returning_none_hands_over_the_args_as_they_are() -> None:
    body = Recorder()
    outcome = await make(body, parameters=READ_PARAMS, parse_args=gives(None)).call(
        '{"path": "a.txt"}', CTX)
    assert outcome.status == "ok"
    assert body.args == [{"path": "a.txt"}]


async def test_parser_returning_a_dict_replaces_the_args() -> None:
    body = Recorder()
    outcome = await make(body, parse_args=gives({"path": "b.txt", "offset": 3})).call(
        '{"path": "a.txt"}', CTX)
    assert outcome.status == "ok"
    assert body.args == [{"path": "b.txt", "offset": 3}]


async def test_two_argument_parser_receives_the_context() -> None:
    seen: list[ToolContext] = []

    def parse(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        seen.append(context)
        return {**args, "tenant": context.principal}

    body = Recorder()
    outcome = await make(body, parse_args=parse).call('{"id": 1}', CTX)
    assert outcome.status == "ok"
    assert seen == [CTX]
    assert body.args == [{"id": 1, "tenant": "key-a"}]


async def test_async_parser_is_awaited() -> None:
    async def parse(args: dict[str, Any]) -> dict[str, Any]:
        return {"n": int(args["n"]) * 2}

    body = Recorder()
    outcome = await make(body, parse_args=parse).call('{"n": "21"}', CTX)
    assert outcome.status == "ok"
    assert body.args == [{"n": 42}]


async def test_parser_tool_error_is_the_verbatim_rejection() -> None:
    body = Recorder()
    outcome = await make(body, parse_args=raises(ToolError("x"))).call("{}", CTX)
    assert (outcome.status, outcome.content) == ("rejected", "x")
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "parser"
    assert outcome.exception is None
    assert body.calls == []


async def test_parser_crash_is_rescued_in_its_own_formatting() -> None:
    crash = ValueError("bad date")
    body = Recorder()
    outcome = await make(body, parse_args=raises(crash)).call("{}", CTX)
    assert (outcome.status, outcome.content) == ("rejected", "ERROR: (ValueError) bad date")
    assert outcome.exception is crash
    assert outcome.traceback is not None
    assert "ValueError: bad date" in outcome.traceback
    assert body.calls == []


@pytest.mark.parametrize(("value", "type_name"), [("ok", "str"), (["a"], "list"), (True, "bool")])
async def test_parser_returning_a_wrong_type_is_a_rejection(value: Any, type_name: str) -> None:
    body = Recorder()
    outcome = await make(body, name="p", parse_args=gives(value)).call("{}", CTX)
    assert outcome.status == "rejected"
    assert outcome.content == (f"ERROR: (TypeError) parse_args of tool 'p' returned {type_name}; "
                               "it must return None or a dict, or raise ToolError")
    assert isinstance(outcome.exception, TypeError)
    assert body.calls == []


async def test_a_parser_replaces_the_required_key_check() -> None:
    body = Recorder()
    outcome = await make(body, parameters=READ_PARAMS, parse_args=gives(None)).call(
        '{"file_path": "a.txt"}', CTX)
    assert outcome.status == "ok"
    assert body.args == [{"file_path": "a.txt"}]


def lookup_path(args: dict[str, Any]) -> str:
    return str(args["path"])


@pytest.mark.parametrize(
    "declaration",
    [
        pytest.param({"parameters": OPTIONAL_READ_PARAMS, "parse_args": gives(None)}, id="parse_args"),
        pytest.param({"args_model": Invoice}, id="args_model"),
    ],
)
async def test_with_a_parser_a_body_key_error_keeps_its_own_formatting(declaration: dict[str, Any]) -> None:
    args = {"vendor_name": "v", "total": 1} if "args_model" in declaration else {"file_path": "a.txt"}
    outcome = await make(lookup_path, **declaration).call(args, CTX)
    assert (outcome.status, outcome.content) == ("error", "ERROR: (KeyError) 'path'")
    assert isinstance(outcome.exception, KeyError)
    assert outcome.names is None


# --- args_model ---------------------------------------------------------------------------------


async def test_args_model_lists_every_violation_in_one_message() -> None:
    body = Recorder()
    outcome = await make(body, name="inv", args_model=Invoice).call(
        '{"vendorName": "Acme", "total": "lots", "currency": "gbp"}', CTX)
    assert outcome.status == "rejected"
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "missing_arguments"
    assert outcome.content.splitlines() == [
        "Tool 'inv': 3 arguments do not fit the declared parameters.",
        "- vendor_name: missing (required)",
        "- total: Input should be a valid number, unable to parse string as a number (got \"lots\")",
        "- currency: Input should be 'usd' or 'eur' (got \"gbp\")",
        "Required parameters: vendor_name, total",
        "Unrecognized: vendorName (did you mean 'vendor_name'?)",
        "Accepted parameters: vendor_name, total, currency",
        "Fix every problem listed and call 'inv' again.",
    ]
    assert body.calls == []


async def test_args_model_type_violation_alone_is_a_parser_rejection() -> None:
    outcome = await make(name="inv", args_model=Invoice).call('{"vendor_name": "Acme", "total": "lots"}', CTX)
    assert outcome.status == "rejected"
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "parser"
    assert outcome.content.startswith("Tool 'inv': 1 argument does not fit the declared parameters.\n")


async def test_args_model_with_only_missing_arguments_speaks_like_the_plain_check() -> None:
    modelled = await make(name="inv", args_model=Invoice).call('{"vendorName": "Acme"}', CTX)
    plain = await make(name="inv", parameters=[Param("vendor_name", "string", required=True),
                                               Param("total", "number", required=True),
                                               Param("currency", "string")]).call('{"vendorName": "Acme"}', CTX)
    assert modelled.status == plain.status == "rejected"
    assert modelled.content == plain.content
    assert modelled.content.splitlines()[:3] == [
        "Tool 'inv': required arguments are missing.",
        "Required parameters: vendor_name, total",
        "Missing: vendor_name, total",
    ]


async def test_args_model_hands_the_body_validated_values_with_defaults() -> None:
    body = Recorder()
    outcome = await make(body, args_model=Invoice).call('{"vendor_name": "Acme", "total": "12.5"}', CTX)
    assert outcome.status == "ok"
    assert body.args == [{"vendor_name": "Acme", "total": 12.5, "currency": "usd"}]


# --- parse_arguments: the parse step alone -------------------------------------------------------


def upper_path(args: dict[str, Any]) -> dict[str, Any]:
    return {"path": str(args["file"]).upper()}


@pytest.mark.parametrize(
    ("declaration", "raw", "expected"),
    [
        pytest.param({"parameters": READ_PARAMS}, '{"path": "a.txt"}', {"path": "a.txt"}, id="check-only"),
        pytest.param({"parse_args": upper_path}, '{"file": "a.txt"}', {"path": "A.TXT"}, id="transforming-parser"),
        pytest.param({"parse_args": gives(None)}, '{"x": 1}', {"x": 1}, id="accepting-parser"),
        pytest.param({"args_model": Invoice}, '{"vendor_name": "v", "total": "2"}',
                     {"vendor_name": "v", "total": 2.0, "currency": "usd"}, id="args_model"),
    ],
)
async def test_parse_arguments_returns_what_the_body_will_receive(declaration: dict[str, Any], raw: str,
                                                                   expected: dict[str, Any]) -> None:
    body = Recorder()
    built = make(body, **declaration)
    parsed = await built.parse_arguments(raw, CTX)
    assert parsed == Parsed(expected)
    assert body.calls == []
    outcome = await built.call(raw, CTX)
    assert outcome.status == "ok"
    assert body.args == [parsed.arguments]
    assert outcome.arguments == parsed.arguments


@pytest.mark.parametrize(
    ("declaration", "raw"),
    [
        pytest.param({"parameters": READ_PARAMS}, '{"file_path": "a"}', id="missing"),
        pytest.param({"parse_args": raises(ToolError("no such record"))}, "{}", id="parser-refuses"),
        pytest.param({"args_model": Invoice}, '{"total": "x"}', id="model"),
        pytest.param({}, "[1]", id="not-an-object"),
    ],
)
async def test_parse_arguments_rejects_with_the_message_execution_would_send(declaration: dict[str, Any],
                                                                              raw: str) -> None:
    body = Recorder()
    built = make(body, **declaration)
    parsed = await built.parse_arguments(raw, CTX)
    assert isinstance(parsed, Rejection)
    outcome = await built.call(raw, CTX)
    assert (outcome.status, outcome.content) == ("rejected", parsed.message)
    assert outcome.rejection is not None
    assert outcome.rejection.reason == parsed.reason
    assert body.calls == []


# --- a body that fails on an argument name (no parser) --------------------------------------------


def inner(path: str, offset: int = 0) -> str:
    return f"{path}@{offset}"


def splat(args: dict[str, Any]) -> str:
    return inner(**args)


@pytest.mark.parametrize(
    ("body", "raw", "headline", "missing"),
    [
        pytest.param(lookup_path, {"file_path": "a.txt"}, "the tool needs argument 'path', which was not sent.",
                     "Missing: path", id="key-error"),
        pytest.param(splat, {"file_path": "a.txt"}, "the tool does not take an argument named 'file_path'.",
                     None, id="unexpected-keyword"),
        pytest.param(splat, {"offset": 1, "file_path": "a.txt"},
                     "the tool does not take an argument named 'file_path'.", None, id="unexpected-with-others"),
    ],
)
async def test_a_body_failing_on_an_argument_name_gets_the_did_you_mean_message(
        body: Callable[..., Any], raw: dict[str, Any], headline: str, missing: str | None) -> None:
    outcome = await make(body, parameters=OPTIONAL_READ_PARAMS).call(raw, CTX)
    assert outcome.status == "error"
    assert isinstance(outcome.content, str)
    lines = outcome.content.splitlines()
    assert lines[0] == f"Tool 'read': {headline}"
    assert "Unrecognized: file_path (did you mean 'path'?)" in lines
    assert "Accepted parameters: path, offset" in lines
    assert (missing in lines) if missing else not any(line.startswith("Missing") for line in lines)
    assert "Traceback" not in outcome.content
    assert isinstance(outcome.exception, KeyError | TypeError)
    assert outcome.traceback is not None


async def test_a_body_missing_a_positional_argument_gets_the_missing_message() -> None:
    outcome = await make(splat, parameters=OPTIONAL_READ_PARAMS).call({}, CTX)
    assert outcome.status == "error"
    assert outcome.content.splitlines()[:3] == [
        "Tool 'read': required arguments are missing.",
        "Required parameters: path",
        "Missing: path",
    ]


async def test_a_body_key_error_on_an_undeclared_tool_still_names_the_argument() -> None:
    outcome = await make(lookup_path, parameters_schema={"type": "object"}).call({"file_path": "a"}, CTX)
    assert outcome.status == "error"
    assert outcome.content.startswith("Tool 'read': the tool needs argument 'path', which was not sent.")
    assert "Unrecognized" not in outcome.content


def lookup_config(args: dict[str, Any]) -> str:
    return str({"debug": True}["verbose"])


def lookup_elsewhere(args: dict[str, Any]) -> str:
    return str({}["path"])  # a lookup of a sent argument's name, but not in the args


def bad_call(args: dict[str, Any]) -> str:
    return str(len(args, 2))  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("body", "content"),
    [
        pytest.param(lookup_config, "ERROR: (KeyError) 'verbose'", id="key-not-a-parameter"),
        pytest.param(lookup_elsewhere, "ERROR: (KeyError) 'path'", id="key-that-was-sent"),
        pytest.param(bad_call, "ERROR: (TypeError) len() takes exactly one argument (2 given)",
                     id="unrelated-type-error"),
    ],
)
async def test_other_body_failures_are_not_argument_diagnostics(body: Callable[..., Any], content: str) -> None:
    outcome = await make(body, parameters=READ_PARAMS).call({"path": "a.txt"}, CTX)
    assert (outcome.status, outcome.content) == ("error", content)
    assert outcome.names is None


# --- result normalisation ------------------------------------------------------------------------


async def test_a_string_result_is_the_content() -> None:
    outcome = await returning("hello").call({}, CTX)
    assert (outcome.status, outcome.content, outcome.processed_content) == ("ok", "hello", None)


@pytest.mark.parametrize("value", [{"a": [1, 2]}, [1, "two"], 3, 2.5, True, False, None])
async def test_native_results_are_json_content_and_kept_as_processed_content(value: Any) -> None:
    outcome = await returning(value).call({}, CTX)
    assert outcome.status == "ok"
    assert isinstance(outcome.content, str)
    assert json.loads(outcome.content) == value
    assert outcome.processed_content == value
    assert type(outcome.processed_content) is type(value)


async def test_a_pydantic_model_result_is_json_content() -> None:
    invoice = Invoice(vendor_name="Acme", total=3)
    outcome = await returning(invoice).call({}, CTX)
    assert outcome.status == "ok"
    assert json.loads(str(outcome.content)) == {"vendor_name": "Acme", "total": 3.0, "currency": "usd"}
    assert outcome.processed_content is invoice


async def test_tool_result_gives_full_control() -> None:
    parts = [{"type": "text", "text": "see image"}, {"type": "image_url", "image_url": {"url": "data:,x"}}]
    result = ToolResult(content=parts, processed_content={"id": 7}, display_text="Rendered",
                        options={"cache_control": {"type": "ephemeral"}})
    outcome = await make(gives(result), display_text="Rendering").call({}, CTX)
    assert outcome.status == "ok"
    assert outcome.content == parts
    assert outcome.processed_content == {"id": 7}
    assert outcome.display_text == "Rendered"
    assert outcome.options == {"cache_control": {"type": "ephemeral"}}
    assert outcome.content_text() == "see image\n"


async def test_tool_result_falls_back_to_the_tools_display_text() -> None:
    outcome = await make(gives(ToolResult(content="x")), display_text="Reading").call({}, CTX)
    assert outcome.display_text == "Reading"


async def test_tool_result_is_error_is_an_error_outcome() -> None:
    outcome = await returning(ToolResult(content="quota exceeded", is_error=True)).call({}, CTX)
    assert (outcome.status, outcome.content, outcome.error_type) == ("error", "quota exceeded", "tool_error")
    assert outcome.failed


@pytest.mark.parametrize("content", [["not", "parts"], {"type": "text"}, [{"x": object()}]])
async def test_tool_result_with_unusable_content_is_an_error(content: Any) -> None:
    outcome = await returning(ToolResult(content=content)).call({}, CTX)
    assert outcome.status == "error"
    assert outcome.content == ("ERROR: (TypeError) ToolResult.content must be a string "
                               "or a list of JSON content parts")


async def test_an_unserialisable_result_is_an_error_outcome_not_an_exception() -> None:
    outcome = await returning(object()).call({}, CTX)
    assert outcome.status == "error"
    assert isinstance(outcome.content, str)
    assert outcome.content.startswith("ERROR: (TypeError) result of type object cannot be sent to the model")
    assert isinstance(outcome.exception, TypeError)


# --- errors and interrupts -----------------------------------------------------------------------


async def test_tool_error_is_sent_verbatim() -> None:
    outcome = await raising(ToolError("No such file: a.txt. Try list_files first.")).call({}, CTX)
    assert (outcome.status, outcome.content) == ("error", "No such file: a.txt. Try list_files first.")
    assert outcome.exception is None


async def test_any_other_exception_is_rescued_with_exception_and_traceback_kept() -> None:
    boom = ValueError("boom")
    outcome = await raising(boom).call({}, CTX)
    assert (outcome.status, outcome.content, outcome.error_type) == ("error", "ERROR: (ValueError) boom", "ValueError")
    assert outcome.exception is boom
    assert outcome.traceback is not None
    assert "raise exc" in outcome.traceback
    assert "Traceback" not in outcome.content


def interrupt_raised(args: dict[str, Any]) -> Any:
    raise Interrupt("review", data={"secret": 1})


def interrupt_returned(args: dict[str, Any]) -> Any:
    return Interrupt("review", data={"secret": 1})


@pytest.mark.parametrize("body", [interrupt_raised, interrupt_returned], ids=["raised", "returned"])
async def test_interrupt_pauses_and_keeps_its_data_from_the_model(body: Callable[..., Any]) -> None:
    outcome = await make(body).call({}, CTX)
    assert (outcome.status, outcome.content) == ("interrupted", "review")
    assert outcome.interrupt_data == {"secret": 1}
    assert "secret" not in outcome.content_text()
    assert outcome.processed_content is None
    assert not outcome.failed


# --- timeouts ------------------------------------------------------------------------------------


def timeout_message(name: str, limit: str) -> str:
    return (f"Tool '{name}' did not finish within {limit} s and was abandoned. "
            "Its effects are unknown; check before calling it again.")


async def test_a_per_tool_timeout_ends_the_wait_and_tells_the_model() -> None:
    outcome = await make(hang, name="slow", timeout=0.01).call({}, CTX, default_timeout=1000)
    assert (outcome.status, outcome.error_type) == ("timeout", "timeout")
    assert outcome.content == timeout_message("slow", "0.01")
    assert outcome.failed


async def test_the_default_timeout_applies_when_the_tool_sets_none() -> None:
    outcome = await make(hang, name="slow").call({}, CTX, default_timeout=0.02)
    assert (outcome.status, outcome.content) == ("timeout", timeout_message("slow", "0.02"))


async def test_a_sync_body_that_overruns_is_abandoned() -> None:
    release = threading.Event()
    finished = threading.Event()

    def stuck(args: dict[str, Any]) -> str:
        release.wait(timeout=30)
        finished.set()
        return "late"

    try:
        outcome = await make(stuck, name="slow", timeout=0.01).call({}, CTX)
        assert outcome.status == "timeout"
        assert not finished.is_set()
    finally:
        release.set()


async def test_a_body_raising_timeout_error_itself_is_an_error() -> None:
    outcome = await make(raises(TimeoutError("upstream slow")), timeout=60).call({}, CTX)
    assert (outcome.status, outcome.content) == ("error", "ERROR: (TimeoutError) upstream slow")
    assert isinstance(outcome.exception, TimeoutError)


# --- how bodies are called -----------------------------------------------------------------------


async def test_sync_bodies_run_in_a_thread_and_async_bodies_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    seen: dict[str, int] = {}

    def sync_body(args: dict[str, Any]) -> str:
        seen["sync"] = threading.get_ident()
        return "s"

    async def async_body(args: dict[str, Any]) -> str:
        seen["async"] = threading.get_ident()
        return "a"

    assert (await make(sync_body).call({}, CTX)).content == "s"
    assert (await make(async_body).call({}, CTX)).content == "a"
    assert seen["async"] == loop_thread
    assert seen["sync"] != loop_thread


async def test_a_two_argument_body_receives_the_context() -> None:
    body = Recorder()
    await make(body).call('{"q": 1}', CTX)
    assert body.calls == [({"q": 1}, CTX)]


async def test_the_outcome_carries_the_calls_identity_and_arguments() -> None:
    outcome = await make(parameters=READ_PARAMS).call('{"path": "a.txt"}', CTX)
    assert outcome == ToolOutcome(call_id="call-1", tool_name="read", status="ok", content="done",
                                  arguments={"path": "a.txt"})


async def test_a_flood_of_unrecognized_names_gives_a_bounded_message() -> None:
    tool = Tool(name="read_file", function=lambda a: "x",
                parameters=[Param("path", "string", required=True)])
    flood = json.dumps({f"key_{i}_" + "x" * 200: i for i in range(5000)})
    outcome = await tool.call(flood, ToolContext(tool_call_id="c"))
    assert outcome.status == "rejected"
    assert "and 4980 more" in outcome.content_text()
    assert len(outcome.content_text()) < 3000
    assert outcome.names is not None
    assert len(outcome.names.unrecognized) == 20


async def test_nan_results_are_json_null() -> None:
    tool = Tool(name="nan", function=lambda a: {"value": float("nan")})
    outcome = await tool.call("{}", ToolContext(tool_call_id="c"))
    assert (outcome.status, outcome.content) == ("ok", '{"value":null}')


async def test_a_schema_violation_is_labelled_as_such(make_stack: StackFactory) -> None:
    checked = Tool(name="checked", parameters=[Param("n", "integer", required=True)], validate_schema=True,
                   function=lambda a: a["n"])
    stack = await make_stack(registry=ToolRegistry([checked]))
    stack.script.then(Reply(tool_calls=[("checked", {"n": "many"})]), Reply(content="done"))
    raw = await stack.client.chat.completions.with_raw_response.create(model="m", messages=USER)
    [call] = [s for s in stack.spans(raw.headers["x-trace-id"]) if s.name == names.SPAN_TOOL_CALL]
    assert (call.attributes or {})[names.ATTR_REJECTION_REASON] == "schema_violation"
    assert stack.metric(names.METRIC_TOOL_REJECTIONS, tool="checked", reason="schema_violation") == 1
    assert stack.metric(names.METRIC_TOOL_REJECTIONS, tool="checked", reason="parser") == 0
