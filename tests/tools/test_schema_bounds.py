"""Schemas written by others, checked at a bounded cost (issue 53): references resolved inside the
schema only, a fan-out of references found before any check, every keyword metered, `uniqueItems`
in one pass; for the gateway's own schema-checked tools (MCP tools) as for the client's."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft4Validator, Draft202012Validator

from gateway.tools import Parsed, Rejection, Tool, ToolContext, ToolDeclarationError, ToolExecutor, ToolRegistry
from gateway.tools.hooks import ToolCall, Turn
from gateway.tools.params import check_names
from gateway.tools.schema import bounded_validator, schema_validator, value_problems
from gateway.tools.schema_bounds import INLINE, OFF_LOOP, Budget, OverBudget, metered, spend, unique_items

CONTEXT = ToolContext(tool_call_id="call_1")
OUTSIDE = "http://127.0.0.1:9"  # the discard port: nothing should ever try it


@pytest.fixture
def connections() -> Iterator[list[Any]]:
    """Every connection attempted while the test runs (and none is made)."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        attempts.append(args[1:] or args)
        raise OSError("the test forbids connections")

    with mock.patch.object(socket.socket, "connect", refuse), mock.patch("socket.create_connection", refuse):
        yield attempts


def validator_or_skip(schema: dict[str, Any], budget: Budget = OFF_LOOP) -> Any:
    with metered(budget):
        return schema_validator("t", schema)


def problems(validator: Any, args: dict[str, Any], budget: Budget = OFF_LOOP) -> list[str]:
    with metered(budget):
        return value_problems(validator, args, check_names(args, (), tuple(args)))


def outside_references() -> dict[str, dict[str, Any]]:
    return {
        "ref_to_url": {"type": "object", "properties": {"a": {"$ref": f"{OUTSIDE}/a.json"}}},
        "id_and_relative_ref": {"$id": f"{OUTSIDE}/tool.json", "type": "object",
                                "properties": {"a": {"$ref": "a.json"}}},
        "dynamic_ref": {"type": "object", "properties": {"a": {"$dynamicRef": f"{OUTSIDE}/a.json#meta"}}},
        "relative_ref_without_id": {"type": "object", "properties": {"a": {"$ref": "a.json#/x"}}},
        "metaschema": {"type": "object", "properties": {"a": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}},
        "in_unused_defs": {"type": "object", "$defs": {"x": {"$ref": f"{OUTSIDE}/x.json"}}},
        "draft_7": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                    "properties": {"a": {"$ref": f"{OUTSIDE}/a.json"}}},
    }


@pytest.mark.parametrize("form", list(outside_references()))
def test_a_reference_leading_outside_the_schema_is_remote_and_never_followed(form: str,
                                                                              connections: list[Any]) -> None:
    assert validator_or_skip(outside_references()[form]) == "remote_ref"
    assert connections == []


@pytest.mark.parametrize("schema", [
    {"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}},
    {"$id": "https://tools.example/t.json", "type": "object",
     "$defs": {"n": {"$id": "number.json", "type": "integer"}}, "properties": {"a": {"$ref": "number.json"}}},
    {"$id": "https://tools.example/t.json", "type": "object", "$defs": {"n": {"type": "integer"}},
     "properties": {"a": {"$ref": "https://tools.example/t.json#/$defs/n"}}},
    {"type": "object", "$defs": {"n": {"$anchor": "count", "type": "integer"}},
     "properties": {"a": {"$ref": "#count"}}},
    {"type": "object", "$defs": {"n": {"$dynamicAnchor": "count", "type": "integer"}},
     "properties": {"a": {"$dynamicRef": "#count"}}},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
     "definitions": {"n": {"id": "#count", "type": "integer"}}, "properties": {"a": {"$ref": "#/definitions/n"}}},
], ids=["pointer", "embedded_id", "own_absolute_id", "anchor", "dynamic_anchor", "draft_4"])
def test_references_inside_the_schema_are_followed(schema: dict[str, Any], connections: list[Any]) -> None:
    validator = validator_or_skip(schema)
    assert not isinstance(validator, str)
    assert problems(validator, {"a": 3}) == []
    assert problems(validator, {"a": "three"}) == ["- a: 'three' is not of type 'integer'"]
    assert connections == []


@pytest.mark.parametrize("reference", ["#/$defs/missing", "#nowhere"])
def test_a_reference_to_nowhere_inside_the_schema_is_an_invalid_schema(reference: str) -> None:
    assert validator_or_skip({"type": "object", "properties": {"a": {"$ref": reference}}}) == "invalid_schema"


def fan_out(levels: int) -> dict[str, Any]:
    """Each level refers twice to the next: a check of any value applies 2**levels subschemas."""
    defs: dict[str, Any] = {f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
                            for i in range(levels)}
    defs[f"l{levels}"] = {"type": "string"}
    return {"type": "object", "$defs": defs, "properties": {"q": {"$ref": "#/$defs/l0"}}}


def test_a_fan_out_of_references_is_too_complex_before_any_value_is_checked() -> None:
    with metered(OFF_LOOP) as meter:
        assert schema_validator("t", fan_out(30)) == "too_complex"
    assert meter.left > OFF_LOOP.steps // 2  # found by counting the schema once, not by expanding it
    shallow = validator_or_skip(fan_out(5))
    assert problems(shallow, {"q": "x"}) == []
    assert problems(shallow, {"q": 1}) == ["- q: 1 is not of type 'string'"] * 20  # of 32, the first 20


def test_a_recursive_schema_is_checked_as_deep_as_the_value_goes() -> None:
    json_value = {"anyOf": [{"type": ["string", "number", "boolean", "null"]},
                            {"type": "array", "items": {"$ref": "#/$defs/value"}},
                            {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}}]}
    validator = validator_or_skip({"type": "object", "$defs": {"value": json_value},
                                   "properties": {"v": {"$ref": "#/$defs/value"}}})
    assert problems(validator, {"v": {"a": [1, {"b": [True, None, "x"]}]}}) == []
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    assert problems(validator, {"v": deep}) == []


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "string"}}},
    {"type": "object", "patternProperties": {"^(a+)+$": {"type": "string"}}, "unevaluatedProperties": False},
], ids=["nested_dialect", "unevaluated_beside_patterns"])
def test_what_would_leave_the_bounded_validator_is_too_complex(schema: dict[str, Any]) -> None:
    assert validator_or_skip(schema) == "too_complex"


def test_every_keyword_spends_from_the_budget() -> None:
    validator = validator_or_skip({"type": "object", "properties": {"xs": {"type": "array",
                                                                           "items": {"type": "integer"}}}})
    with pytest.raises(OverBudget):
        problems(validator, {"xs": list(range(3_000))}, INLINE)
    assert problems(validator, {"xs": list(range(3_000))}) == []
    args = {"xs": list(range(3_000))}
    with metered(Budget(steps=10**9, seconds=0.0)), pytest.raises(OverBudget):  # the clock, read now and then
        value_problems(validator, args, check_names(args, (), ("xs",)))
    spend(10**9)  # outside a check: nothing to spend from


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, 1.0, 2.5, -0.0]) | st.sampled_from("ab"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xy"), inner, max_size=2),
    max_leaves=12)


@given(st.lists(json_values, max_size=8))
def test_unique_items_finds_what_jsonschema_finds(items: list[Any]) -> None:
    stock = Draft202012Validator({"uniqueItems": True}).is_valid(items)
    with metered(OFF_LOOP):
        assert (list(unique_items(Draft202012Validator({}), True, items, {})) == []) == stock


def test_unique_items_over_many_objects_is_linear_and_metered() -> None:
    validator = validator_or_skip({"type": "object", "properties": {"rows": {"type": "array", "uniqueItems": True}}})
    rows = [{"id": i} for i in range(20_000)]
    with pytest.raises(OverBudget):
        problems(validator, {"rows": rows}, INLINE)
    # Within OFF_LOOP's steps; its second is not what is under test (a busy machine may take longer).
    steps_only = Budget(steps=OFF_LOOP.steps, seconds=600.0, yields=True)
    assert problems(validator, {"rows": rows}, steps_only) == []
    [duplicate] = problems(validator, {"rows": [*rows[:50], {"id": 7}]})
    assert duplicate.startswith("- rows: [{'id': 0}")
    assert duplicate.endswith("...")


def test_a_schema_is_checked_against_its_metaschema_in_one_pass_over_its_arrays() -> None:
    """jsonschema's metaschemas say `uniqueItems` of `type` (inside an anyOf that keeps going past
    the first failure) and, in draft 4, of `enum`: compared in pairs, 1,500 objects there took
    seconds to check."""
    objects = [{"a": i} for i in range(1_500)]
    with metered(OFF_LOOP) as meter, pytest.raises(ToolDeclarationError, match="is not valid JSON Schema"):
        schema_validator("t", {"type": "object", "properties": {"x": {"type": objects}}})
    assert meter.left > 0
    draft_4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
               "properties": {"x": {"enum": objects}}}
    Draft4Validator.check_schema({**draft_4, "properties": {"x": {"enum": objects[:10]}}})  # valid, as written
    assert not isinstance(validator_or_skip(draft_4), str)


def test_a_long_problem_is_cut_in_the_declaration_error() -> None:
    with pytest.raises(ToolDeclarationError) as raised:
        Tool(name="t", parameters_schema={"type": "object", "properties": {"x": {"type": ["s" * 500]}}},
             validate_schema=True, function=lambda args: "")
    assert len(str(raised.value)) < 300


# --- the gateway's own schema-checked tools (an MCP server's) --------------------------------------------

def checked_tool(schema: dict[str, Any]) -> Tool:
    return Tool(name="remote_tool", parameters_schema=schema, validate_schema=True, function=lambda args: "ran")


async def test_a_gateway_tool_whose_schema_refers_outside_checks_names_only(connections: list[Any]) -> None:
    tool = checked_tool({"type": "object", "properties": {"a": {"$ref": f"{OUTSIDE}/a.json"}}, "required": ["a"]})
    assert await tool.parse_arguments('{"a": 7}', CONTEXT) == Parsed({"a": 7}, unchecked="remote_ref")
    missing = await tool.parse_arguments('{"b": 7}', CONTEXT)
    assert isinstance(missing, Rejection)
    assert missing.reason == "missing_arguments"
    assert connections == []


async def test_a_gateway_tool_past_its_budget_has_its_values_unchecked_and_says_so() -> None:
    items = checked_tool({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}})
    wrong = await items.parse_arguments({"xs": [1, "two"]}, CONTEXT)
    assert isinstance(wrong, Rejection)
    assert wrong.reason == "schema_violation"
    many = {"xs": list(range(5_000))}
    assert await items.parse_arguments(many, CONTEXT) == Parsed(many, unchecked="too_complex")
    assert bounded_validator("t", fan_out(30)) == "too_complex"
    fanned = Tool(name="fanned", parameters_schema=fan_out(30), validate_schema=True, function=lambda args: "ran")
    async with ToolExecutor(ToolRegistry([items, fanned])) as executor:
        outcome = await executor.run_call(ToolCall("c1", "fanned", '{"q": "x"}'), Turn())
        assert (outcome.status, outcome.content, outcome.unchecked) == ("ok", "ran", "too_complex")
        outcome = await executor.run_call(ToolCall("c2", "remote_tool", many), Turn())
        assert (outcome.status, outcome.unchecked) == ("ok", "too_complex")
        outcome = await executor.run_call(ToolCall("c3", "remote_tool", {"xs": [1]}), Turn())
        assert (outcome.status, outcome.unchecked) == ("ok", None)


simple_schemas = st.recursive(
    st.fixed_dictionaries({}, optional={"type": st.sampled_from(["string", "integer", "array", "object", "null"]),
                                        "minimum": st.integers(-2, 2), "enum": st.lists(json_values, max_size=3),
                                        "uniqueItems": st.booleans(), "maxItems": st.integers(0, 3)}),
    lambda inner: st.one_of(st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
                            st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=3)}),
                            st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=2)}),
                            st.fixed_dictionaries({"items": inner}, optional={"uniqueItems": st.booleans()}),
                            st.fixed_dictionaries({"properties": st.dictionaries(st.sampled_from("xy"), inner,
                                                                                 max_size=2)})),
    max_leaves=8)


@given(schema=simple_schemas, value=json_values)
def test_the_bounded_validator_says_what_jsonschema_says(schema: dict[str, Any], value: Any) -> None:
    """Its own `uniqueItems`, `anyOf` and `oneOf` included (each branch checked up to its first
    error only): the same errors, in the same words, at the same places."""
    bounded = validator_or_skip(schema)
    assert not isinstance(bounded, str)
    with metered(OFF_LOOP):
        ours = sorted((list(e.absolute_path), e.message) for e in bounded.iter_errors(value))
    theirs = sorted((list(e.absolute_path), e.message) for e in Draft202012Validator(schema).iter_errors(value))
    assert ours == theirs
