"""Argument repair and parameter aliases (issue 61), through the official clients (openai for Chat
Completions and Responses, anthropic for Messages), streamed and not, against the scripted provider
that records what it received: in mode apply a call with a sure fix runs on the fixed arguments and
the model gets the real result; in observe it stays rejected, the fix recorded beside it; two names
that fit are never guessed between; a key's and a glob's mode apply to theirs; a password stays
masked in what repair records; an alias is accepted and counted. Each is checked where an operator
looks: the tool.call span, the metrics and the trajectory store's row."""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import Annotated, Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from gateway.demo.model import Reply
from gateway.tools import Alias, Param, Tool, ToolRegistry, tool
from telemetry import names
from tests.conftest import TEST_KEY, Stack, StackFactory, tool_call_spans
from tests.e2e.guards import AWS_KEY
from tests.e2e.test_guardrails import EVERY_WAY, VAULT_SERVER, converse, results_sent, span_texts, vault_result

SECRET = "hunter2-" + "q" * 14  # a password argument: masked wherever repair records the arguments
# What repair makes of {"A": "1", "b": 2} for add(a: integer, b: integer): the name's case, then the type.
SENT = {"A": "1", "b": 2}
CHANGES = ["rename A -> a", "type a: string -> integer"]
_REPAIR_COLUMNS = "outcome, rejection_reason, repair_mode, repair_changes, repair_before, repair_after, aliases"


def adder(ran: list[dict[str, Any]], name: str = "add", **fields: Any) -> Tool:
    """add(a, b), integers, its values checked against its schema; its body notes what it ran with."""
    def add(args: dict[str, Any]) -> str:
        ran.append(args)
        return str(args["a"] + args["b"])

    return Tool(name=name, description="Add two integers", function=add, validate_schema=True,
                parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True)], **fields)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def repair_of(span: ReadableSpan) -> tuple[Any, ...]:
    """The span's outcome and what it says repair found: mode, changes, before and after (decoded)."""
    found = attributes(span)
    before, after = found.get(names.ATTR_REPAIR_BEFORE), found.get(names.ATTR_REPAIR_AFTER)
    return (found[names.ATTR_OUTCOME], found.get(names.ATTR_REPAIR_MODE),
            list(found.get(names.ATTR_REPAIR_CHANGES) or []) or None,
            None if before is None else json.loads(str(before)), None if after is None else json.loads(str(after)))


async def stored_calls(stack: Stack) -> list[dict[str, Any]]:
    """The store's tool_calls rows, in the order they started, with the repair and alias columns."""
    await stack.store.flushed()
    with sqlite3.connect(stack.store.path) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(f"SELECT tool, {_REPAIR_COLUMNS} FROM tool_calls ORDER BY started")]


def decoded(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row with its JSON columns read."""
    return {name: json.loads(value) if name in ("repair_changes", "repair_before", "repair_after", "aliases")
            and value is not None else value for name, value in row.items()}


# --- apply and observe, every API ---------------------------------------------------------------------------

@EVERY_WAY
async def test_apply_runs_the_tool_on_the_repaired_arguments(make_stack: StackFactory, api: str,
                                                             stream: bool) -> None:
    ran: list[dict[str, Any]] = []
    stack = await make_stack(registry=ToolRegistry([adder(ran)]), argument_repair="apply")
    stack.script.then(Reply(tool_calls=[("add", SENT)]), Reply(content="It is 3."))
    text, trace_id = await converse(stack, api, stream)
    assert text == "It is 3."
    assert ran == [{"a": 1, "b": 2}]  # the body got the fixed arguments
    assert results_sent(stack.upstream_requests[1], api) == ["3"]  # the model, the real result
    [span] = tool_call_spans(stack, trace_id)
    assert repair_of(span) == ("repaired", "apply", CHANGES, SENT, {"a": 1, "b": 2})
    assert names.ATTR_REJECTION_REASON not in attributes(span)
    assert stack.metric(names.METRIC_TOOL_REPAIRS, tool="add", mode="apply") == 1
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="add", outcome="repaired") == 1
    [row] = await stored_calls(stack)
    assert decoded(row) == {"tool": "add", "outcome": "repaired", "rejection_reason": None, "repair_mode": "apply",
                            "repair_changes": CHANGES, "repair_before": SENT, "repair_after": {"a": 1, "b": 2},
                            "aliases": None}


@EVERY_WAY
async def test_observe_records_the_fix_and_leaves_the_call_rejected(make_stack: StackFactory, api: str,
                                                                    stream: bool) -> None:
    ran: list[dict[str, Any]] = []
    stack = await make_stack(registry=ToolRegistry([adder(ran)]), argument_repair="observe")
    stack.script.then(Reply(tool_calls=[("add", SENT)]), Reply(content="I could not add."))
    text, trace_id = await converse(stack, api, stream)
    assert text == "I could not add."
    assert ran == []  # the body never ran
    [told] = results_sent(stack.upstream_requests[1], api)
    assert told.startswith("Tool 'add': required arguments are missing.")  # the parse step's words
    assert "Unrecognized: A (did you mean 'a'?)" in told
    [span] = tool_call_spans(stack, trace_id)
    assert repair_of(span) == ("rejected", "observe", CHANGES, SENT, {"a": 1, "b": 2})
    assert attributes(span)[names.ATTR_REJECTION_REASON] == "missing_arguments"
    assert stack.metric(names.METRIC_TOOL_REPAIRS, tool="add", mode="observe") == 1
    assert stack.metric(names.METRIC_TOOL_REPAIRS, mode="apply") == 0
    [row] = await stored_calls(stack)
    assert decoded(row) == {"tool": "add", "outcome": "rejected", "rejection_reason": "missing_arguments",
                            "repair_mode": "observe", "repair_changes": CHANGES, "repair_before": SENT,
                            "repair_after": {"a": 1, "b": 2}, "aliases": None}


async def test_the_diagnostic_in_observe_is_the_one_without_repair(make_stack: StackFactory) -> None:
    """Observing costs the model nothing: it reads the words it would read with repair off."""
    told = []
    for mode in ("off", "observe"):
        stack = await make_stack(registry=ToolRegistry([adder([])]), argument_repair=mode)
        stack.script.then(Reply(tool_calls=[("add", SENT)]), Reply(content="No."))
        await converse(stack, "chat", False)
        told.append(results_sent(stack.upstream_requests[1], "chat"))
    assert told[0] == told[1]


async def test_a_bare_value_is_wrapped_and_a_boolean_read_from_its_string(make_stack: StackFactory) -> None:
    ran: list[dict[str, Any]] = []

    def search(args: dict[str, Any]) -> str:
        ran.append(args)
        return f"{len(args['tags'])} tags, exact {args['exact']}"

    registry = ToolRegistry([Tool(name="search", function=search, validate_schema=True, parameters=[
        Param("tags", "array", item_type="string", required=True), Param("exact", "boolean", required=True)])])
    stack = await make_stack(registry=registry, argument_repair="apply")
    stack.script.then(Reply(tool_calls=[("search", {"tags": "red", "exact": "true"})]), Reply(content="Found."))
    _, trace_id = await converse(stack, "responses", True)
    assert ran == [{"tags": ["red"], "exact": True}]
    assert results_sent(stack.upstream_requests[1], "responses") == ["1 tags, exact True"]
    [span] = tool_call_spans(stack, trace_id)
    assert repair_of(span)[:3] == ("repaired", "apply", ["wrap tags in an array", "type exact: string -> boolean"])


# --- never a guess ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sent", [
    {"date": "2026-01-02"},  # fits start_date and end_date alike
    {"startDate": "2026-01-02", "Start_Date": "2026-01-03", "end_date": "2026-01-04"}],  # two sent for one
    ids=["two-parameters", "two-names-sent"])
async def test_two_names_that_fit_are_never_guessed_between(make_stack: StackFactory, sent: dict[str, str]) -> None:
    ran: list[dict[str, Any]] = []

    def book(args: dict[str, Any]) -> str:
        ran.append(args)
        return "booked"

    registry = ToolRegistry([Tool(name="book", function=book, parameters=[
        Param("start_date", "string", required=True), Param("end_date", "string", required=True)])])
    stack = await make_stack(registry=registry, argument_repair="apply")
    stack.script.then(Reply(tool_calls=[("book", sent)]), Reply(content="Which date?"))
    _, trace_id = await converse(stack, "messages", False)
    assert ran == []
    [span] = tool_call_spans(stack, trace_id)
    assert repair_of(span) == ("rejected", None, None, None, None)  # a plain rejection: no repair recorded
    assert stack.metric(names.METRIC_TOOL_REPAIRS) == 0
    [row] = await stored_calls(stack)
    assert (row["outcome"], row["repair_mode"], row["repair_changes"]) == ("rejected", None, None)


# --- whose mode -------------------------------------------------------------------------------------------------

async def test_a_keys_mode_comes_over_the_gateways(make_stack: StackFactory) -> None:
    ran: list[dict[str, Any]] = []
    stack = await make_stack(registry=ToolRegistry([adder(ran)]), argument_repair="apply",
                             keys={"careful": {"key": TEST_KEY, "argument_repair": "off"}})
    stack.script.then(Reply(tool_calls=[("add", SENT)]), Reply(content="No."))
    _, trace_id = await converse(stack, "chat", True)
    assert ran == []
    [span] = tool_call_spans(stack, trace_id)
    assert repair_of(span) == ("rejected", None, None, None, None)
    assert stack.metric(names.METRIC_TOOL_REPAIRS) == 0


async def test_a_tools_mode_by_glob_applies_to_the_tools_it_matches(make_stack: StackFactory) -> None:
    ran: list[dict[str, Any]] = []
    registry = ToolRegistry([adder(ran, "calc_add"), adder(ran, "plain_add"),
                             adder(ran, "own_add", argument_repair="observe")])
    stack = await make_stack(registry=registry, tool_argument_repair={"calc_*": "apply", "*_add": "observe"})
    calls = [(name, SENT) for name in ("calc_add", "plain_add", "own_add")]
    stack.script.then(Reply(tool_calls=calls), Reply(content="Done."))
    _, trace_id = await converse(stack, "chat", False)
    assert ran == [{"a": 1, "b": 2}]  # calc_add's, the first pattern that names it: apply
    spans = tool_call_spans(stack, trace_id)
    assert [repair_of(span)[:2] for span in spans] == [("repaired", "apply"), ("rejected", "observe"),
                                                       ("rejected", "observe")]
    assert [row["repair_mode"] for row in await stored_calls(stack)] == ["apply", "observe", "observe"]


async def test_a_tools_own_mode_comes_over_the_glob_and_the_key_over_both(make_stack: StackFactory) -> None:
    ran: list[dict[str, Any]] = []
    registry = ToolRegistry([adder(ran, "calc_add", argument_repair="observe")])
    stack = await make_stack(registry=registry, tool_argument_repair={"calc_*": "apply"})
    stack.script.then(Reply(tool_calls=[("calc_add", SENT)]), Reply(content="No."))
    _, trace_id = await converse(stack, "chat", False)
    [span] = tool_call_spans(stack, trace_id)
    assert (repair_of(span)[:2], ran) == (("rejected", "observe"), [])
    keyed = await make_stack(registry=registry, tool_argument_repair={"calc_*": "off"},
                             keys={"eager": {"key": TEST_KEY, "argument_repair": "apply"}})
    keyed.script.then(Reply(tool_calls=[("calc_add", SENT)]), Reply(content="3."))
    _, trace_id = await converse(keyed, "chat", False)
    [span] = tool_call_spans(keyed, trace_id)
    assert (repair_of(span)[:2], ran) == (("repaired", "apply"), [{"a": 1, "b": 2}])


# --- a secret stays masked ------------------------------------------------------------------------------------

async def test_a_repaired_calls_password_is_in_no_span_and_no_stored_row(make_stack: StackFactory) -> None:
    ran: list[dict[str, Any]] = []

    def login(args: dict[str, Any]) -> str:
        ran.append(args)
        return f"logged in as {args['user']}"

    registry = ToolRegistry([Tool(name="login", function=login, validate_schema=True, parameters=[
        Param("user", "string", required=True), Param("password", "string", required=True),
        Param("days", "integer", required=True)])])
    stack = await make_stack(registry=registry, argument_repair="apply", record_tool_arguments=True)
    stack.script.then(Reply(tool_calls=[("login", {"User": "ann", "password": SECRET, "days": "30"})]),
                      Reply(content="In."))
    _, trace_id = await converse(stack, "chat", True)
    assert ran == [{"user": "ann", "password": SECRET, "days": 30}]  # the tool gets it, as it was sent
    [span] = tool_call_spans(stack, trace_id)
    assert repair_of(span) == ("repaired", "apply", ["rename User -> user", "type days: string -> integer"],
                               {"User": "ann", "password": "[REDACTED]", "days": "30"},
                               {"user": "ann", "password": "[REDACTED]", "days": 30})
    assert SECRET not in span_texts(stack.spans())
    [row] = await stored_calls(stack)
    assert decoded(row)["repair_after"] == {"user": "ann", "password": "[REDACTED]", "days": 30}
    with sqlite3.connect(stack.store.path) as db:
        assert SECRET not in "\n".join(db.iterdump())


async def test_a_value_a_guardrail_hid_is_hidden_in_what_repair_records(make_stack: StackFactory) -> None:
    """The secrets guardrail denies the mended call for the key under `note` (no redact key): the
    key is masked in the arguments and, as much, in repair's before and after (it was not: a
    review found it in both, on the span and in the store)."""
    ran: list[dict[str, Any]] = []
    registry = ToolRegistry([Tool(name="save", function=lambda args: ran.append(args), validate_schema=True,
                                  parameters=[Param("path", "string", required=True), Param("note", "string")])])
    stack = await make_stack(registry=registry, argument_repair="apply", guardrails=["secrets"])
    stack.script.then(Reply(tool_calls=[("save", {"Path": "/a", "note": f"key {AWS_KEY}"})]), Reply(content="No."))
    _, trace_id = await converse(stack, "chat", False)
    assert ran == []
    [span] = tool_call_spans(stack, trace_id)
    found = attributes(span)
    assert (found[names.ATTR_OUTCOME], found[names.ATTR_REJECTION_REASON], found[names.ATTR_REPAIR_MODE]) == (
        "rejected", "guardrail_denied", "apply")
    assert AWS_KEY not in span_texts(stack.spans())
    assert names.GUARDRAIL_HIDDEN_MASK in str(found[names.ATTR_REPAIR_BEFORE])
    with sqlite3.connect(stack.store.path) as db:
        await stack.store.flushed()
        assert AWS_KEY not in "\n".join(db.iterdump())


async def test_a_value_sent_under_an_alias_of_a_secret_parameter_is_masked(make_stack: StackFactory) -> None:
    """`pwd` stands for `password`: what the call's span records masks it as it masks `password`
    (it did not, until a review found it), in the arguments, in repair's before and after, and in
    the diagnostic."""
    registry = ToolRegistry([Tool(name="login", function=lambda args: "in", validate_schema=True, parameters=[
        Param("user", "string", required=True), Param("password", "string", required=True, aliases=["pwd"]),
        Param("days", "integer", required=True)])])
    stack = await make_stack(registry=registry, argument_repair="observe", record_tool_arguments=True)
    stack.script.then(Reply(tool_calls=[("login", {"User": "ann", "pwd": SECRET, "days": "30"})]),
                      Reply(content="Not in."))
    _, trace_id = await converse(stack, "chat", False)
    [span] = tool_call_spans(stack, trace_id)
    assert attributes(span)[names.ATTR_REPAIR_MODE] == "observe"
    assert attributes(span)[names.ATTR_ARGS_ALIASES] == ("pwd->password",)
    assert SECRET not in span_texts([span])
    await stack.store.flushed()
    with sqlite3.connect(stack.store.path) as db:
        assert SECRET not in "\n".join(db.iterdump())


# --- aliases -------------------------------------------------------------------------------------------------------

async def _read_through_alias(stack: Stack, tool_name: str, api: str, stream: bool) -> ReadableSpan:
    """One call of `tool_name` naming its `path` `file_path`; its span, once the model got the result."""
    stack.script.then(Reply(tool_calls=[(tool_name, {"file_path": "/etc/motd"})]), Reply(content="Read."))
    text, trace_id = await converse(stack, api, stream)
    assert text == "Read."
    assert results_sent(stack.upstream_requests[-1], api) == ["the text of /etc/motd"]
    [span] = tool_call_spans(stack, trace_id)
    return span


def read_file(args: dict[str, Any]) -> str:
    return f"the text of {args['path']}"


@EVERY_WAY
async def test_an_alias_a_param_declares_is_accepted_and_counted(make_stack: StackFactory, api: str,
                                                                 stream: bool) -> None:
    registry = ToolRegistry([Tool(name="read_file", function=read_file, parameters=[
        Param("path", "string", required=True, aliases=["file_path", "filepath"])])])
    stack = await make_stack(registry=registry)
    span = await _read_through_alias(stack, "read_file", api, stream)
    assert attributes(span)[names.ATTR_OUTCOME] == "ok"
    assert list(attributes(span)[names.ATTR_ARGS_ALIASES]) == ["file_path->path"]
    assert names.ATTR_REPAIR_MODE not in attributes(span)
    assert stack.metric(names.METRIC_TOOL_ALIASES_USED, tool="read_file", parameter="path") == 1
    [row] = await stored_calls(stack)
    assert (row["outcome"], decoded(row)["aliases"], row["repair_mode"]) == ("ok", ["file_path->path"], None)


async def test_an_alias_of_an_annotated_hint_is_accepted(make_stack: StackFactory) -> None:
    @tool
    def read_text(path: Annotated[str, Alias("file_path")]) -> str:
        """Read a text file.

        Args:
            path: where it is
        """
        return f"the text of {path}"

    stack = await make_stack(registry=ToolRegistry([read_text]))
    span = await _read_through_alias(stack, "read_text", "responses", False)
    assert list(attributes(span)[names.ATTR_ARGS_ALIASES]) == ["file_path->path"]
    assert stack.metric(names.METRIC_TOOL_ALIASES_USED, tool="read_text", parameter="path") == 1
    assert "file_path" not in json.dumps(stack.upstream_requests[0]["tools"])  # the model is offered `path` only


async def test_the_settings_alias_a_tool_registered_without_any(make_stack: StackFactory) -> None:
    registry = ToolRegistry([Tool(name="read_file", function=read_file,
                                  parameters=[Param("path", "string", required=True)])])
    stack = await make_stack(registry=registry, tool_aliases={"read_file": {"path": ["file_path"]}})
    span = await _read_through_alias(stack, "read_file", "messages", True)
    assert list(attributes(span)[names.ATTR_ARGS_ALIASES]) == ["file_path->path"]
    assert stack.metric(names.METRIC_TOOL_ALIASES_USED, tool="read_file", parameter="path") == 1
    [row] = await stored_calls(stack)
    assert decoded(row)["aliases"] == ["file_path->path"]


async def test_without_the_alias_the_same_call_is_rejected(make_stack: StackFactory) -> None:
    """The control of the tests above: what the alias accepts is a rejection without it."""
    registry = ToolRegistry([Tool(name="read_file", function=read_file,
                                  parameters=[Param("path", "string", required=True)])])
    stack = await make_stack(registry=registry)
    stack.script.then(Reply(tool_calls=[("read_file", {"file_path": "/etc/motd"})]), Reply(content="No."))
    _, trace_id = await converse(stack, "chat", False)
    [span] = tool_call_spans(stack, trace_id)
    assert (attributes(span)[names.ATTR_OUTCOME], names.ATTR_ARGS_ALIASES in attributes(span)) == ("rejected", False)
    assert stack.metric(names.METRIC_TOOL_ALIASES_USED) == 0


async def test_an_mcp_servers_tool_takes_the_settings_alias_and_its_globs_repair(make_stack: StackFactory) -> None:
    """Tools a server lists after start-up get the settings' aliases and repair modes as the
    registry's own do."""
    stack = await make_stack(mcp_servers={"vault": {"command": sys.executable, "args": [str(VAULT_SERVER)]}},
                             tool_aliases={"vault__credentials": {"account": ["account_name"]}},
                             tool_argument_repair={"vault__*": "apply"})
    stack.script.then(Reply(tool_calls=[("vault__credentials", {"account_name": "billing"}),
                                        ("vault__credentials", {"acount": "payroll"})]), Reply(content="Both."))
    _, trace_id = await converse(stack, "chat", False)
    assert results_sent(stack.upstream_requests[1], "chat") == [vault_result("billing", AWS_KEY),
                                                               vault_result("payroll", AWS_KEY)]
    aliased, repaired = tool_call_spans(stack, trace_id)
    assert (attributes(aliased)[names.ATTR_OUTCOME], list(attributes(aliased)[names.ATTR_ARGS_ALIASES])) == (
        "ok", ["account_name->account"])
    assert repair_of(repaired) == ("repaired", "apply", ["rename acount -> account"], {"acount": "payroll"},
                                   {"account": "payroll"})
    assert stack.metric(names.METRIC_TOOL_ALIASES_USED, tool="vault__credentials", parameter="account") == 1
