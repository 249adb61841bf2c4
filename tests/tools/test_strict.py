"""Strict tools: the offered schema satisfies OpenAI's strict mode in every declaration style,
undeclarable schemas fail when the tool is built, and the nulls strict mode makes a model send
for optional parameters reach the body as "not sent"."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from gateway.apis.chat import CHAT
from gateway.apis.responses import RESPONSES
from gateway.tools import Param, Parsed, Rejection, Tool, ToolContext, ToolDeclarationError, tool

CTX = ToolContext(tool_call_id="call-1", trajectory_id="traj-1")

# --- the checker: strict mode's documented rules, written down independently of gateway/tools ----
# https://platform.openai.com/docs/guides/structured-outputs#supported-schemas
# https://platform.openai.com/docs/guides/function-calling#strict-mode

CHECKED_KEYWORDS = frozenset({
    "type", "description", "enum", "const", "anyOf", "$ref", "properties", "required", "additionalProperties",
    "items", "pattern", "format", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "minItems", "maxItems",
})
CHECKED_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})


def strict_problems(root: Mapping[str, Any], nullable: set[str]) -> list[str]:
    """Every way `root` breaks a strict-mode rule. `nullable` is the exact set of property paths
    ("a.b", "rows[].c") that must accept null: the optional ones, and the ones declared nullable."""
    problems: list[str] = []
    if root.get("type") != "object" or "anyOf" in root:
        problems.append("root: must be a plain object schema (no anyOf)")
    defs = root.get("$defs", {})
    for name, sub in defs.items():
        problems += _node_problems(sub, f"$defs/{name}")
    problems += _node_problems({k: v for k, v in root.items() if k != "$defs"}, "(root)")
    found = dict(_property_paths(root, root, "", ()))
    for path, sub in found.items():
        if (path in nullable) != _accepts_null(sub, root, ()):
            problems.append(f"{path}: nullable should be {path in nullable}")
    problems += [f"{path}: expected a property here" for path in nullable - set(found)]
    return problems


def _node_problems(node: Any, where: str) -> list[str]:
    if not isinstance(node, dict):
        return [f"{where}: not a schema object"]
    problems = [f"{where}: keyword {key!r} is not supported" for key in node if key not in CHECKED_KEYWORDS]
    if "format" in node and node["format"] not in CHECKED_FORMATS:
        problems.append(f"{where}: format {node['format']!r} is not supported")
    if "$ref" in node and len(node) > 1:
        problems.append(f"{where}: $ref beside other keywords")
    types = node.get("type")
    types = [types] if isinstance(types, str) else types or []
    if "object" in types:
        props = node.get("properties")
        if not isinstance(props, dict) or (not props and where != "(root)"):
            problems.append(f"{where}: an object without declared properties")
            props = {}
        if sorted(node.get("required", [])) != sorted(props):
            problems.append(f"{where}: required {node.get('required')} is not every property {list(props)}")
        if node.get("additionalProperties") is not False:
            problems.append(f"{where}: additionalProperties is not false")
        for name, sub in props.items():
            problems += _node_problems(sub, f"{where}.{name}")
    if "array" in types:
        problems += _node_problems(node.get("items"), f"{where}[]")
    for i, sub in enumerate(node.get("anyOf", [])):
        problems += _node_problems(sub, f"{where}|{i}")
    return problems


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if ref == "#":
        return root
    if isinstance(ref, str):
        resolved: Mapping[str, Any] = root["$defs"][ref.removeprefix("#/$defs/")]
        return resolved
    return node


def _accepts_null(node: Mapping[str, Any], root: Mapping[str, Any], seen: tuple[str, ...]) -> bool:
    if node.get("$ref") in seen:
        return False
    target = _resolve(node, root)
    types = target.get("type")
    return ((types == "null" or (isinstance(types, list) and "null" in types))
            or None in target.get("enum", [1]) or ("const" in target and target["const"] is None)
            or any(_accepts_null(b, root, (*seen, str(node.get("$ref")))) for b in target.get("anyOf", [])))


def _property_paths(node: Mapping[str, Any], root: Mapping[str, Any], prefix: str,
                    seen: tuple[str, ...]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, schema) of every property reachable from `node`, through $ref, anyOf and items;
    a recursive $ref is followed once."""
    ref = node.get("$ref")
    if ref in seen:
        return
    seen = (*seen, ref) if isinstance(ref, str) else seen
    target = _resolve(node, root)
    for name, sub in target.get("properties", {}).items():
        path = f"{prefix}{name}"
        yield path, sub
        yield from _property_paths(sub, root, f"{path}.", seen)
    for branch in target.get("anyOf", []):
        yield from _property_paths(branch, root, prefix, seen)
    if isinstance(target.get("items"), dict):
        yield from _property_paths(target["items"], root, f"{prefix.removesuffix('.')}[].", seen)


def assert_strict(schema: Mapping[str, Any], nullable: set[str]) -> None:
    problems = strict_problems(schema, nullable)
    assert not problems, "\n".join(problems)


# --- strict tools of every declaration style --------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str = Field(description="street and number")
    unit: str | None = None
    floor: int = 0


class LineItem(BaseModel):
    sku: str
    quantity: int = Field(1, ge=1)
    color: Color = Color.RED


class Order(BaseModel):
    customer: str
    ship_to: Address = Field(description="where to deliver")
    bill_to: Address | None = None
    items: list[LineItem]
    priority: Literal["low", "high"] = "low"
    placed: datetime | None = None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Adoption(BaseModel):
    pet: Cat | Dog = Field(discriminator="kind")
    pets: list[Cat | Dog] = []


class TreeNode(BaseModel):
    label: str
    children: list[TreeNode] = []
    parent: TreeNode | None = Field(None, description="the node above")


def echo(args: dict[str, Any]) -> dict[str, Any]:
    return args


@tool(strict=True)
def ship(city: str, address: Address, tags: list[str], mode: Literal["air", "sea"] = "sea",
         note: Optional[str] = None, backup: Address | None = None, offset: int = 0,  # noqa: UP045
         parcels: list[Address] | None = None) -> str:
    """Ship a parcel.

    Args:
        city: destination city
        offset: days to wait
    """
    return city


PARAMS = [
    Param("path", "string", required=True),
    Param("offset", "integer"),
    Param("unit", "string", enum=["c", "f"]),
    Param("filter", "object", required=True, properties=[Param("limit", "integer"),
                                                         Param("kind", "string", required=True)]),
    Param("rows", "array", item_type="object", properties=[Param("id", "integer", required=True),
                                                          Param("note", "string")]),
    Param("tags", "array", item_type="string", required=True),
]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "expression": {"type": "string", "description": "what to compute"},
        "precision": {"type": "integer", "minimum": 0, "maximum": 12, "default": 2},
        "mode": {"type": "string", "enum": ["exact", "float"]},
        "when": {"type": "string", "format": "date"},
        "site": {"type": "string", "format": "uri"},
        "cursor": {"type": ["string", "null"]},
        "vars": {"type": "array", "items": {"type": "object", "title": "Var",
                                            "properties": {"name": {"type": "string"},
                                                           "value": {"type": "number"}},
                                            "required": ["name"]}},
        "options": {"type": "object", "properties": {"trace": {"type": "boolean"}}},
    },
    "required": ["expression", "cursor"],
}


STRICT_TOOLS = [
    pytest.param(ship, {"mode", "note", "backup", "offset", "parcels", "address.unit", "address.floor",
                        "backup.unit", "backup.floor", "parcels[].unit", "parcels[].floor"}, id="tool-decorator"),
    pytest.param(Tool(name="find", function=echo, parameters=PARAMS, strict=True),
                 {"offset", "unit", "filter.limit", "rows", "rows[].note"}, id="parameters"),
    pytest.param(Tool(name="calc", function=echo, parameters_schema=SCHEMA, strict=True),
                 {"precision", "mode", "when", "site", "cursor", "vars", "vars[].value", "options",
                  "options.trace"}, id="parameters_schema"),
    pytest.param(Tool(name="order", function=echo, args_model=Order, strict=True),
                 {"ship_to.unit", "ship_to.floor", "bill_to", "bill_to.unit", "bill_to.floor", "items[].quantity",
                  "items[].color", "priority", "placed"}, id="args_model"),
    pytest.param(Tool(name="tree", function=echo, args_model=TreeNode, strict=True),
                 {"children", "parent", "children[].children", "children[].parent", "parent.children",
                  "parent.parent"}, id="recursive-model"),
    pytest.param(Tool(name="adopt", function=echo, args_model=Adoption, strict=True),
                 {"pet.lives", "pet.good", "pets", "pets[].lives", "pets[].good"}, id="tagged-union"),
    pytest.param(Tool(name="ping", function=echo, strict=True), set(), id="no-arguments"),
]


@pytest.mark.parametrize(("strict_tool", "nullable"), STRICT_TOOLS)
def test_the_offered_schema_satisfies_strict_mode(strict_tool: Tool, nullable: set[str]) -> None:
    assert_strict(strict_tool.schema, nullable)
    assert CHAT.tool_spec(strict_tool)["function"]["parameters"] == strict_tool.schema
    assert RESPONSES.tool_spec(strict_tool)["parameters"] == strict_tool.schema


def test_the_checker_catches_what_strict_tools_offered_before() -> None:
    """The old `parameters=[...]` strict output: closed objects, but optional fields left out of
    `required` and not nullable, which OpenAI refuses for every request that offers the tool."""
    old = {"type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}},
           "required": ["path"], "additionalProperties": False}
    assert strict_problems(old, {"offset"}) == [
        "(root): required ['path'] is not every property ['path', 'offset']",
        "offset: nullable should be True",
    ]


def test_non_strict_tools_keep_the_declared_schema() -> None:
    for strict_tool, _ in (p.values for p in STRICT_TOOLS):
        plain = Tool(name=strict_tool.name, function=echo, parameters=strict_tool.parameters,
                     parameters_schema=strict_tool.parameters_schema, args_model=strict_tool.args_model)
        assert plain.schema == strict_tool.declared_schema
        assert "additionalProperties" not in plain.schema


def test_value_checks_pydantic_makes_are_left_to_the_parse_step() -> None:
    class Code(BaseModel):
        code: str = Field(min_length=2, max_length=3)
        labels: set[str]

    strict_tool = Tool(name="code", function=echo, args_model=Code, strict=True)
    assert strict_tool.schema["properties"] == {"code": {"type": "string"},
                                                "labels": {"type": "array", "items": {"type": "string"}}}
    assert_strict(strict_tool.schema, set())


async def test_a_dropped_value_check_still_rejects_in_the_parse_step() -> None:
    class Code(BaseModel):
        code: str = Field(max_length=3)

    parsed = await Tool(name="code", function=echo, args_model=Code, strict=True).parse_arguments({"code": "abcd"}, CTX)
    assert isinstance(parsed, Rejection)
    assert "code: String should have at most 3 characters" in parsed.message


# --- declarations strict mode cannot express fail when the tool is built --------------------------


class Counts(BaseModel):
    counts: dict[str, int]


class Anything(BaseModel):
    payload: Any


class Pair(BaseModel):
    pair: tuple[int, str]


def nested_params(levels: int) -> list[Param]:
    """Objects nested `levels` deep, the root object being the first level."""
    params = [Param("leaf", "string", required=True)]
    for depth in range(levels - 1, 0, -1):
        params = [Param(f"level{depth}", "object", required=True, properties=params)]
    return params


def object_schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


UNDECLARABLE = [
    pytest.param({"parameters": [Param("meta", "object")]},
                 "parameter 'meta' declares no properties (a free-form dict)", id="free-form-param"),
    pytest.param({"parameters_schema": {"type": "object"}},
                 "the arguments object declares no properties (a free-form dict)", id="free-form-root"),
    pytest.param({"parameters_schema": object_schema(tags={"type": "object", "properties": {}})},
                 "parameter 'tags' declares no properties", id="empty-nested-object"),
    pytest.param({"args_model": Counts},
                 "parameter 'counts' takes undeclared keys (additionalProperties)", id="dict-field"),
    pytest.param({"parameters_schema": {**object_schema(a={"type": "string"}), "additionalProperties": True}},
                 "the arguments object takes undeclared keys", id="additionalProperties-true"),
    pytest.param({"args_model": Anything}, "parameter 'payload' declares no type, so it takes any value",
                 id="any-field"),
    pytest.param({"parameters_schema": object_schema(code={"type": "string", "minLength": 2})},
                 "parameter 'code' uses 'minLength', which strict mode does not support and nothing else would check",
                 id="minLength-unchecked"),
    pytest.param({"parameters_schema": object_schema(tags={"type": "array", "items": {"type": "string"},
                                                           "uniqueItems": True})},
                 "parameter 'tags' uses 'uniqueItems'", id="uniqueItems-unchecked"),
    pytest.param({"args_model": Pair}, "parameter 'pair' uses 'prefixItems'", id="tuple"),
    pytest.param({"parameters_schema": object_schema(n={"allOf": [{"type": "integer"}, {"minimum": 1}]})},
                 "parameter 'n' combines schemas with 'allOf'", id="allOf"),
    pytest.param({"parameters_schema": object_schema(n={"type": "integer", "not": {"const": 3}})},
                 "parameter 'n' uses 'not', which strict mode does not support", id="not"),
    pytest.param({"parameters_schema": object_schema(n={"oneOf": [{"type": "integer"}, {"type": "number"}]})},
                 "parameter 'n' uses 'oneOf'", id="oneOf"),
    pytest.param({"parameters_schema": object_schema(n={"if": {"type": "string"}, "then": {"type": "string"},
                                                        "type": "string"})},
                 "parameter 'n' uses 'if'", id="if-then"),
    pytest.param({"parameters": [Param("tags", "array")]}, "parameter 'tags' is an array without one item schema",
                 id="array-without-items"),
    pytest.param({"parameters_schema": {**object_schema(a={"$ref": "#/definitions/A"}),
                                        "definitions": {"A": {"type": "string"}}}},
                 "the arguments object uses 'definitions'", id="definitions"),
    pytest.param({"parameters_schema": object_schema(a={"$ref": "https://example.com/a.json"})},
                 "parameter 'a' refers to 'https://example.com/a.json', which is not one of its own $defs",
                 id="outside-ref"),
    pytest.param({"parameters_schema": {**object_schema(a={"type": "string"}),
                                        "anyOf": [{"required": ["a"]}, {"required": []}]}},
                 "the arguments object must be a plain object, not a union", id="root-union"),
    pytest.param({"parameters_schema": object_schema(a={"type": "date"})}, "parameter 'a' has type 'date'",
                 id="unknown-type"),
    pytest.param({"parameters": nested_params(11)}, "its objects nest 11 levels deep; strict mode allows 10",
                 id="too-deep"),
    pytest.param({"parameters": [Param(f"p{i}", "string", required=True) for i in range(5001)]},
                 "it declares 5001 object properties; strict mode allows 5000", id="too-many-properties"),
    pytest.param({"parameters": [Param("a", "integer", enum=range(600)), Param("b", "integer", enum=range(401))]},
                 "its enums hold 1001 values; strict mode allows 1000", id="too-many-enum-values"),
    pytest.param({"parameters": [Param("a", "string", enum=[f"{i:060d}" for i in range(300)])]},
                 "an enum of 300 values holds 18000 characters; over 250 values, strict mode allows 15000",
                 id="long-large-enum"),
    pytest.param({"parameters": [Param("a" * 60_001, "string"), Param("b" * 60_000, "string")]},
                 "its names, enum and const values run to 120001 characters; strict mode allows 120000",
                 id="too-many-characters"),
]


@pytest.mark.parametrize(("declaration", "message"), UNDECLARABLE)
def test_what_strict_mode_cannot_express_fails_at_build_time(declaration: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolDeclarationError) as caught:
        Tool(name="broken", function=echo, strict=True, **declaration)
    assert str(caught.value).startswith("tool 'broken' cannot be strict: ")
    assert message in str(caught.value)
    Tool(name="broken", function=echo, **declaration)  # the same declaration is fine without strict


def test_the_limits_are_inclusive() -> None:
    Tool(name="deep", function=echo, parameters=nested_params(10), strict=True)
    Tool(name="wide", function=echo, parameters=[Param(f"p{i}", "string", required=True) for i in range(5000)],
         strict=True)


def test_a_decorated_function_that_strict_mode_cannot_express_fails_when_decorated() -> None:
    with pytest.raises(ToolDeclarationError, match=r"tool 'tally' cannot be strict: parameter 'counts' takes "):
        @tool(strict=True)
        def tally(counts: dict[str, int]) -> int:
            return sum(counts.values())


def test_a_parser_of_its_own_leaves_no_one_to_check_dropped_constraints() -> None:
    class Code(BaseModel):
        code: str = Field(max_length=3)

    with pytest.raises(ToolDeclarationError, match="'maxLength', which strict mode does not support and nothing"):
        Tool(name="code", function=echo, args_model=Code, parse_args=lambda args: None, strict=True)


# --- null for an optional parameter reaches the body as "not sent" ---------------------------------


class Recorder:
    """A body that keeps the arguments it was given."""

    def __init__(self) -> None:
        self.args: list[dict[str, Any]] = []

    def __call__(self, args: dict[str, Any]) -> str:
        self.args.append(args)
        return "done"


@tool(strict=True)
def read(path: str, offset: int = 0, limit: int | None = 10, mode: Literal["text", "bytes"] = "text",
         at: Address | None = None) -> dict[str, Any]:
    """Read a file."""
    return {"path": path, "offset": offset, "limit": limit, "mode": mode, "at": at}


async def test_tool_decorator_null_takes_the_python_default() -> None:
    outcome = await read.call({"path": "a", "offset": None, "limit": 5, "mode": None, "at": None}, CTX)
    assert outcome.status == "ok"
    assert outcome.processed_content == {"path": "a", "offset": 0, "limit": 5, "mode": "text", "at": None}


async def test_a_null_the_declaration_takes_is_a_value_and_is_kept() -> None:
    outcome = await read.call({"path": "a", "offset": 3, "limit": None, "mode": "bytes", "at": None}, CTX)
    assert outcome.processed_content == {"path": "a", "offset": 3, "limit": None, "mode": "bytes", "at": None}


async def test_tool_decorator_nested_null_takes_the_model_default() -> None:
    at = {"street": "Main 1", "unit": None, "floor": None}
    outcome = await read.call({"path": "a", "offset": None, "limit": None, "mode": None, "at": at}, CTX)
    assert outcome.processed_content["at"] == Address(street="Main 1", unit=None, floor=0)


async def test_args_model_null_takes_the_pydantic_default_at_every_level() -> None:
    body = Recorder()
    order = Tool(name="order", function=body, args_model=Order, strict=True)
    sent = {"customer": "c", "ship_to": {"street": "s", "unit": None, "floor": None}, "bill_to": None,
            "items": [{"sku": "k", "quantity": None, "color": None}], "priority": None, "placed": None}
    outcome = await order.call(sent, CTX)
    assert outcome.status == "ok", outcome.content
    [args] = body.args
    assert args["ship_to"] == Address(street="s", unit=None, floor=0)
    assert args["items"] == [LineItem(sku="k", quantity=1, color=Color.RED)]
    assert (args["bill_to"], args["priority"], args["placed"]) == (None, "low", None)


async def test_parameters_null_keys_are_removed_before_the_body_runs() -> None:
    body = Recorder()
    find = Tool(name="find", function=body, parameters=PARAMS, strict=True)
    sent = {"path": "a", "offset": None, "unit": None, "filter": {"limit": None, "kind": "x"},
            "rows": [{"id": 1, "note": None}, {"id": 2, "note": "n"}], "tags": []}
    outcome = await find.call(sent, CTX)
    assert outcome.status == "ok", outcome.content
    assert body.args == [{"path": "a", "filter": {"kind": "x"}, "rows": [{"id": 1}, {"id": 2, "note": "n"}],
                          "tags": []}]
    assert sent["offset"] is None  # the caller's dict is left as it was


async def test_parameters_schema_null_keys_are_removed_unless_declared_nullable() -> None:
    body = Recorder()
    calc = Tool(name="calc", function=body, parameters_schema=SCHEMA, strict=True)
    sent = {"expression": "1+1", "precision": None, "mode": None, "when": None, "site": None, "cursor": None,
            "vars": [{"name": "x", "value": None}], "options": {"trace": None}}
    outcome = await calc.call(sent, CTX)
    assert outcome.status == "ok", outcome.content
    assert body.args == [{"expression": "1+1", "cursor": None, "vars": [{"name": "x"}], "options": {}}]


async def test_a_recursive_model_reads_nulls_at_every_depth() -> None:
    body = Recorder()
    tree = Tool(name="tree", function=body, args_model=TreeNode, strict=True)
    leaf = {"label": "leaf", "children": None, "parent": None}
    outcome = await tree.call({"label": "root", "children": [leaf], "parent": None}, CTX)
    assert outcome.status == "ok", outcome.content
    [args] = body.args
    assert args["children"] == [TreeNode(label="leaf")]


async def test_optional_parameters_may_still_be_left_out() -> None:
    find = Tool(name="find", function=echo, parameters=PARAMS, strict=True)
    parsed = await find.parse_arguments({"path": "a", "filter": {"kind": "x"}, "tags": []}, CTX)
    assert parsed == Parsed({"path": "a", "filter": {"kind": "x"}, "tags": []})
    assert find.required_names == ("path", "filter", "tags")  # the declaration's, not strict mode's list


async def test_tool_decorator_null_for_a_required_parameter_is_rejected() -> None:
    outcome = await read.call({"path": None, "offset": None, "limit": None, "mode": None, "at": None}, CTX)
    assert outcome.status == "rejected"
    assert "- path: Input should be a valid string (got null)" in str(outcome.content)


async def test_args_model_null_for_a_nested_required_field_is_rejected() -> None:
    order = Tool(name="order", function=echo, args_model=Order, strict=True)
    sent = {"customer": "c", "ship_to": {"street": None, "unit": None, "floor": None}, "bill_to": None,
            "items": [], "priority": None, "placed": None}
    parsed = await order.parse_arguments(sent, CTX)
    assert isinstance(parsed, Rejection)
    assert "- ship_to.street: Input should be a valid string (got null)" in parsed.message


@pytest.mark.parametrize("declaration", [{"parameters": PARAMS}, {"parameters_schema": {
    **object_schema(path={"type": "string"}, filter={"type": "object", "properties": {"kind": {"type": "string"}}},
                    tags={"type": "array", "items": {"type": "string"}})}}], ids=["parameters", "parameters_schema"])
async def test_null_for_a_required_parameter_is_reported_like_a_missing_one(declaration: dict[str, Any]) -> None:
    body = Recorder()
    strict_tool = Tool(name="find", function=body, strict=True, **declaration)
    outcome = await strict_tool.call({"path": None, "filter": {"kind": "x"}, "tags": [], "pth": 1}, CTX)
    assert outcome.status == "rejected"
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "missing_arguments"
    assert outcome.content == (
        "Tool 'find': required arguments are missing or null.\n"
        "Required parameters: path, filter, tags\n"
        "Missing: path\n"
        "Unrecognized: pth (did you mean 'path'?)\n"
        f"Accepted parameters: {', '.join(strict_tool.accepted_names)}\n"
        "Call 'find' again, passing every required parameter under its accepted name.")
    assert body.args == []


async def test_a_parser_of_the_tools_own_sees_optional_nulls_as_not_sent() -> None:
    seen: list[dict[str, Any]] = []
    parser_tool = Tool(name="read", function=echo, parameters=PARAMS[:2], strict=True, parse_args=seen.append)
    await parser_tool.parse_arguments({"path": "a", "offset": None}, CTX)
    assert seen == [{"path": "a"}]


async def test_non_strict_tools_pass_null_through() -> None:
    body = Recorder()
    plain = Tool(name="find", function=body, parameters=PARAMS)
    await plain.call({"path": None, "offset": None, "filter": {"limit": None, "kind": "x"}, "tags": []}, CTX)
    assert body.args == [{"path": None, "offset": None, "filter": {"limit": None, "kind": "x"}, "tags": []}]


async def test_a_tagged_union_reads_nulls_in_the_option_its_tag_picks() -> None:
    body = Recorder()
    adopt = Tool(name="adopt", function=body, args_model=Adoption, strict=True)
    outcome = await adopt.call({"pet": {"kind": "dog", "good": None},
                                "pets": [{"kind": "cat", "lives": None}, {"kind": "dog", "good": False}]}, CTX)
    assert outcome.status == "ok", outcome.content
    assert body.args == [{"pet": Dog(kind="dog"), "pets": [Cat(kind="cat"), Dog(kind="dog", good=False)]}]
