"""Argument repair: what is mended, what never is, the modes by key, tool and glob, and the executor's
use of it (the body runs on the mended arguments only in apply)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway.tools import Param, Rejection, Tool, ToolCall, ToolContext, ToolExecutor, ToolRegistry, Turn, function
from gateway.tools.repair import RepairPolicy, repaired
from gateway.tools.results import Repair

CONTEXT = ToolContext("call-1")


def _echo(args: dict[str, Any]) -> dict[str, Any]:
    return args


def checked(*params: Param, **options: Any) -> Tool:
    return Tool(name="t", function=_echo, parameters=list(params), validate_schema=True, **options)


async def mend(tool: Tool, args: dict[str, Any]) -> Repair | None:
    parsed = await tool.parse_arguments(args, CONTEXT)
    assert isinstance(parsed, Rejection)
    found = await repaired(tool, args, parsed, CONTEXT, applied=True)
    if found is None:
        return None
    repair, reparsed = found
    assert reparsed.arguments == repair.after
    assert Draft202012Validator(tool.declared_schema).is_valid(repair.after)
    return repair


@pytest.mark.parametrize(("params", "sent", "after", "changes"), [
    ([Param("path", "string", required=True)], {"file_path": "/a"}, {"path": "/a"}, ["rename file_path -> path"]),
    ([Param("page_size", "integer", required=True)], {"pageSize": 3}, {"page_size": 3},
     ["rename pageSize -> page_size"]),
    ([Param("query", "string", required=True)], {"qeury": "x"}, {"query": "x"}, ["rename qeury -> query"]),
    ([Param("a", "integer", required=True)], {"a": "12"}, {"a": 12}, ["type a: string -> integer"]),
    ([Param("a", "integer", required=True)], {"a": "-7"}, {"a": -7}, ["type a: string -> integer"]),
    ([Param("x", "number", required=True)], {"x": "2.5"}, {"x": 2.5}, ["type x: string -> number"]),
    ([Param("x", "number", required=True)], {"x": "3"}, {"x": 3}, ["type x: string -> number"]),
    ([Param("on", "boolean", required=True)], {"on": "false"}, {"on": False}, ["type on: string -> boolean"]),
    ([Param("tags", "array", item_type="string", required=True)], {"tags": "red"}, {"tags": ["red"]},
     ["wrap tags in an array"]),
    ([Param("ids", "array", item_type="integer", required=True)], {"ids": 4}, {"ids": [4]}, ["wrap ids in an array"]),
    ([Param("count", "integer", required=True), Param("tags", "array", item_type="string")],
     {"Count": "2", "tags": "a"}, {"count": 2, "tags": ["a"]},
     ["rename Count -> count", "type count: string -> integer", "wrap tags in an array"]),
])
async def test_a_sure_fix_is_found(params: list[Param], sent: dict[str, Any], after: dict[str, Any],
                                   changes: list[str]) -> None:
    repair = await mend(checked(*params), sent)
    assert repair is not None
    assert (repair.before, repair.after, list(repair.changes)) == (sent, after, changes)


@pytest.mark.parametrize(("params", "sent"), [
    # two accepted names fit: a guess
    ([Param("start_date", "string", required=True), Param("end_date", "string", required=True)], {"date": "x"}),
    ([Param("page_size", "integer"), Param("pageSize", "integer")], {"page-size": 1}),
    # two names sent for one parameter
    ([Param("path", "string", required=True)], {"file_path": "/a", "filepath": "/b"}),
    # a shared word alone is no sure fix
    ([Param("user_id", "string", required=True)], {"person_id": "x"}),
    # a value beyond its type
    ([Param("a", "integer", required=True)], {"a": "1.5"}),
    ([Param("a", "integer", required=True)], {"a": "12 apples"}),
    ([Param("a", "integer", required=True)], {"a": " 12"}),
    ([Param("a", "integer", required=True)], {"a": 1.5}),
    ([Param("x", "number", required=True)], {"x": "NaN"}),
    ([Param("x", "number", required=True)], {"x": "1e999"}),
    ([Param("on", "boolean", required=True)], {"on": "yes"}),
    ([Param("on", "boolean", required=True)], {"on": 1}),
    ([Param("tags", "array", item_type="string", required=True)], {"tags": 3}),
    ([Param("tags", "array", item_type="string", required=True)], {"tags": None}),
    # an enum the value is not in
    ([Param("unit", "string", required=True, enum=["c", "f"])], {"Unit": "k"}),
    # a required name nothing sent fits
    ([Param("path", "string", required=True)], {"offset": 3}),
    # a string that may hold several items: wrapped whole, a guess at the list
    ([Param("tags", "array", item_type="string", required=True)], {"tags": "a, b"}),
    ([Param("tags", "array", item_type="string", required=True)], {"tags": '["a", "b"]'}),
    # a unit or a bound added or dropped changes what the value means
    ([Param("timeout_ms", "integer", required=True)], {"timeout": 5}),
    ([Param("timeout", "integer", required=True)], {"timeout_seconds": 5}),
    ([Param("max_price", "number", required=True)], {"price": 5}),
    # two fit, one of them across a bound: still two
    ([Param("acc_routing_start", "boolean"), Param("acc_routing_update", "boolean")], {"acc_routing": True}),
    ([Param("page", "integer"), Param("page_size", "integer")], {"page_length": 10}),
    # a name no parameter's could be
    ([Param("path", "string", required=True)], {"x_" * 40 + "path": "/a"}),
])
async def test_no_guess_and_no_change_of_value(params: list[Param], sent: dict[str, Any]) -> None:
    assert await mend(checked(*params), sent) is None


async def test_only_rejections_of_the_arguments_shape_are_mended() -> None:
    tool = checked(Param("a", "integer", required=True))
    bad_json = await tool.parse_arguments('{"a": "1"', CONTEXT)
    assert isinstance(bad_json, Rejection)
    assert bad_json.reason == "invalid_json"
    assert await repaired(tool, '{"a": "1"', bad_json, CONTEXT, applied=True) is None


async def test_a_tools_own_parser_has_the_last_word() -> None:
    def refuses_small(args: dict[str, Any]) -> None:
        if not isinstance(args.get("a"), int) or args["a"] < 10:
            raise ValueError("a must be an integer of 10 or more")

    tool = Tool(name="t", function=_echo, parse_args=refuses_small, parameters_schema={
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert await mend(tool, {"a": "12"}) is not None
    assert await mend(tool, {"a": "3"}) is None  # fits the schema, but the parser refuses it


def test_the_mode_is_the_keys_then_the_tools_then_the_patterns_then_the_gateways() -> None:
    plain, own = checked(Param("a", "integer")), Tool(name="fs__read", function=_echo, argument_repair="observe")
    policy = RepairPolicy.configured("apply", {"fs__*": "off"}, {"careful": "off"}, [plain, own])
    assert policy is not None
    assert policy.mode(plain, None) == "apply"
    assert policy.mode(plain, "careful") == "off"
    assert policy.mode(own, None) == "observe"
    assert policy.mode(Tool(name="fs__list", function=_echo), "other") == "off"
    assert RepairPolicy.configured("off", {}, {}, [plain]) is None  # nothing asks: nothing is spent
    assert RepairPolicy.configured("off", {}, {}, [own]) is not None


async def _run(policy: RepairPolicy | None, arguments: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    ran: list[dict[str, Any]] = []

    def add(args: dict[str, Any]) -> int:
        ran.append(args)
        return int(args["a"]) + int(args["b"])

    tool = Tool(name="add", function=add, validate_schema=True,
                parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True)])
    async with ToolExecutor(ToolRegistry([tool]), repair=policy) as executor:
        [outcome] = await executor.run_turn([ToolCall("c1", "add", arguments)], Turn())
    return outcome, ran


async def test_apply_runs_the_body_on_the_mended_arguments() -> None:
    outcome, ran = await _run(RepairPolicy("apply"), {"a": "2", "B": 3})
    assert (outcome.status, outcome.content, ran) == ("ok", "5", [{"a": 2, "b": 3}])
    assert outcome.repair == Repair({"a": "2", "B": 3}, {"a": 2, "b": 3},
                                    ("rename B -> b", "type a: string -> integer"), applied=True)


async def test_observe_records_the_fix_and_runs_nothing() -> None:
    outcome, ran = await _run(RepairPolicy("observe"), {"a": "2", "b": 3})
    assert (outcome.status, ran) == ("rejected", [])
    assert outcome.repair is not None
    assert not outcome.repair.applied
    assert outcome.repair.after == {"a": 2, "b": 3}


@pytest.mark.parametrize("policy", [None, RepairPolicy("off")])
async def test_off_leaves_the_rejection_as_it_was(policy: RepairPolicy | None) -> None:
    outcome, ran = await _run(policy, {"a": "2", "b": 3})
    assert (outcome.status, outcome.repair, ran) == ("rejected", None, [])


async def test_a_call_that_passes_is_never_touched() -> None:
    outcome, ran = await _run(RepairPolicy("apply"), {"a": 2, "b": 3})
    assert (outcome.status, outcome.repair, ran) == ("ok", None, [{"a": 2, "b": 3}])


async def test_an_extra_name_an_open_schema_takes_is_not_renamed_into_an_optional_parameter() -> None:
    """The rejection is the type of `a`; `verbose_flag`, which the schema lets through, is left as it
    is rather than taken for `verbose`: renaming it would change what the call asks for."""
    tool = Tool(name="t", function=_echo, validate_schema=True, parameters_schema={
        "type": "object", "additionalProperties": True, "required": ["a"],
        "properties": {"a": {"type": "integer"}, "verbose": {"type": "boolean"}}})
    repair = await mend(tool, {"a": "3", "verbose_flag": True})
    assert repair is not None
    assert (repair.after, repair.changes) == ({"a": 3, "verbose_flag": True}, ("type a: string -> integer",))


async def test_the_aliases_of_a_rejected_and_of_a_repaired_call_are_kept() -> None:
    tool = Tool(name="add", function=lambda args: args["a"] + args["b"], validate_schema=True, parameters=[
        Param("a", "integer", required=True, aliases=["first"]), Param("b", "integer", required=True)])
    async with ToolExecutor(ToolRegistry([tool]), repair=RepairPolicy("observe")) as executor:
        [observed] = await executor.run_turn([ToolCall("c1", "add", {"first": "1", "b": 2})], Turn())
    assert (observed.status, observed.aliases) == ("rejected", (("first", "a"),))
    assert observed.repair is not None
    assert observed.repair.before == {"first": "1", "b": 2}
    assert observed.repair.changes == ("type a: string -> integer",)
    async with ToolExecutor(ToolRegistry([tool]), repair=RepairPolicy("apply")) as executor:
        [applied] = await executor.run_turn([ToolCall("c1", "add", {"first": "1", "b": 2})], Turn())
    assert (applied.status, applied.content, applied.aliases) == ("ok", "3", (("first", "a"),))


async def test_a_parameter_sent_under_two_of_its_names_is_never_repaired() -> None:
    """The clash is the model's to settle: repair mended the other argument and let the last of the
    two values win, `/a` lost unsaid, until a review found it."""
    tool = checked(Param("path", "string", required=True, aliases=["file_path", "filepath"]),
                   Param("count", "integer", required=True))
    assert await mend(tool, {"file_path": "/a", "filepath": "/b", "count": "3"}) is None


async def test_a_call_of_more_invented_names_than_parameters_gets_no_rename() -> None:
    """Comparing every name sent with every parameter cost the loop seconds for a call of thousands
    of names (2.3 s for 5,000 against 20 parameters); such a call has no sure rename anyway."""
    params = [Param(f"field_{n}", "string", required=True) for n in range(20)]
    sent = {f"made_up_{n}": "x" for n in range(5000)}
    sent["Field_0"] = "x"
    assert await mend(checked(*params), sent) is None
    assert await mend(checked(*params[:2]), {"Field_0": "x", "FIELD_1": "y"}) is not None


async def test_a_strict_tools_null_for_an_optional_parameter_does_not_stop_a_repair() -> None:
    tool = Tool(name="t", function=_echo, strict=True, validate_schema=True,
                parameters=[Param("city", "string", required=True), Param("unit", "string")])
    sent = {"city_name": "Lisbon", "unit": None}
    rejection = await tool.parse_arguments(sent, CONTEXT)
    assert isinstance(rejection, Rejection)
    found = await repaired(tool, sent, rejection, CONTEXT, applied=True)
    assert found is not None
    assert found[0].changes == ("rename city_name -> city",)
    assert found[1].arguments == {"city": "Lisbon"}  # the null read as "not sent", as the parse step reads it


async def test_the_declared_schemas_validator_is_built_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool that does not check values itself: the validator repair checks a fix with is compiled,
    once, on a thread (a schema may take up to a tool build's budget to compile)."""
    built_on: list[int] = []
    build = function.bounded_validator

    def watched(*args: Any, **kwargs: Any) -> Any:
        built_on.append(threading.get_ident())
        return build(*args, **kwargs)

    monkeypatch.setattr(function, "bounded_validator", watched)
    tool = Tool(name="t", function=_echo, parameters=[Param("count", "integer", required=True)])
    assert await mend(tool, {"Count": 3}) is not None
    assert await mend(tool, {"COUNT": 3}) is not None
    assert len(built_on) == 1
    assert built_on[0] != threading.get_ident()
