"""`@tool`: a Tool from a typed signature and its docstring."""

import threading
from typing import Any, Literal, Optional

import pytest
from pydantic import BaseModel

from gateway.apis.chat import CHAT
from gateway.tools import Tool, ToolContext, ToolDeclarationError, parse_docstring, tool

CTX = ToolContext(tool_call_id="call-1", trajectory_id="traj-1", principal="team-a")


class Address(BaseModel):
    street: str
    title: str  # a property literally named "title" must survive title-stripping


class Person(BaseModel):
    name: str
    address: Address


def properties(t: Tool) -> dict[str, Any]:
    props: dict[str, Any] = t.schema["properties"]
    return props


# --- the two decorator forms ---------------------------------------------------------------------


def test_bare_decorator_builds_a_tool_named_after_the_function() -> None:
    @tool
    def lookup(city: str) -> str:
        """Find a city."""
        return city

    assert isinstance(lookup, Tool)
    assert lookup.name == "lookup"
    assert lookup.description == "Find a city."
    assert lookup.concurrent is False
    assert lookup.timeout is None


def test_called_decorator_passes_its_options_to_the_tool() -> None:
    @tool(name="find-city", description="Overrides the docstring", concurrent=True, timeout=2.5,
          display_text="Finding", strict=True, options={"cache_control": {"type": "ephemeral"}})
    def lookup(city: str) -> str:
        """Find a city."""
        return city

    assert (lookup.name, lookup.description) == ("find-city", "Overrides the docstring")
    assert (lookup.concurrent, lookup.timeout, lookup.display_text, lookup.strict) == (True, 2.5, "Finding", True)
    assert lookup.options == {"cache_control": {"type": "ephemeral"}}
    assert CHAT.tool_spec(lookup)["function"]["strict"] is True


def test_called_decorator_with_no_arguments() -> None:
    @tool()
    def ping() -> str:
        return "pong"

    assert ping.name == "ping"
    assert ping.schema == {"type": "object", "properties": {}}


def test_an_invalid_name_from_the_decorator_fails_at_build_time() -> None:
    with pytest.raises(ToolDeclarationError, match="'bad name'"):
        tool(name="bad name")(lambda: "x")


# --- schema from the signature -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        pytest.param(str, {"type": "string"}, id="str"),
        pytest.param(int, {"type": "integer"}, id="int"),
        pytest.param(float, {"type": "number"}, id="float"),
        pytest.param(bool, {"type": "boolean"}, id="bool"),
        pytest.param(Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}, id="Optional"),  # noqa: UP045
        pytest.param(int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}, id="union-None"),
        pytest.param(Literal["c", "f"], {"enum": ["c", "f"], "type": "string"}, id="Literal"),
        pytest.param(list[str], {"type": "array", "items": {"type": "string"}}, id="list-str"),
    ],
)
def test_schema_of_each_annotation(annotation: Any, expected: dict[str, Any]) -> None:
    def fn(value: str) -> str:
        return value

    fn.__annotations__["value"] = annotation
    built = tool(fn)
    assert properties(built) == {"value": expected}
    assert built.schema["required"] == ["value"]
    assert built.schema["type"] == "object"


def test_nested_models_become_defs_and_refs_without_titles() -> None:
    @tool
    def save(person: Person) -> str:
        return person.name

    assert properties(save) == {"person": {"$ref": "#/$defs/Person"}}
    assert save.schema["$defs"] == {
        "Address": {"type": "object", "properties": {"street": {"type": "string"}, "title": {"type": "string"}},
                    "required": ["street", "title"]},
        "Person": {"type": "object",
                   "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"}},
                   "required": ["name", "address"]},
    }
    assert "title" not in save.schema


def test_parameters_with_defaults_are_not_required() -> None:
    @tool
    def read(path: str, offset: int = 0, encoding: str | None = None) -> str:
        return path

    assert read.schema["required"] == ["path"]
    assert properties(read)["offset"] == {"type": "integer", "default": 0}
    assert read.accepted_names == ("path", "offset", "encoding")


# --- descriptions from docstrings ----------------------------------------------------------------


def google_style(path: str, offset: int = 0) -> str:
    """Read a text file
    from the workspace.

    Longer explanation that is not part of the summary.

    Args:
        path: The file to read.
        offset (int): Where to start,
            in bytes.

    Returns:
        path: the resolved path (a Returns entry, not a parameter).

    Raises:
        KeyError: never.
    """
    return path


def sphinx_style(path: str, offset: int = 0) -> str:
    """Read a text file from the workspace.

    :param path: The file to read.
    :param int offset: Where to start,
        in bytes.
    :returns: the text.
    """
    return path


@pytest.mark.parametrize("fn", [google_style, sphinx_style], ids=["google", "sphinx"])
def test_descriptions_come_from_the_docstring(fn: Any) -> None:
    built = tool(fn)
    assert built.description == "Read a text file from the workspace."
    assert properties(built)["path"] == {"type": "string", "description": "The file to read."}
    assert properties(built)["offset"] == {"type": "integer", "default": 0, "description": "Where to start, in bytes."}


@pytest.mark.parametrize("fn", [google_style, sphinx_style], ids=["google", "sphinx"])
def test_parse_docstring_finds_only_the_parameters(fn: Any) -> None:
    summary, params = parse_docstring(fn.__doc__)
    assert summary == "Read a text file from the workspace."
    assert params == {"path": "The file to read.", "offset": "Where to start, in bytes."}


def test_no_docstring_means_empty_description_and_no_property_descriptions() -> None:
    @tool
    def bare(x: int) -> int:
        return x

    assert bare.description == ""
    assert properties(bare) == {"x": {"type": "integer"}}


# --- the context parameter -------------------------------------------------------------------------


async def test_a_toolcontext_parameter_receives_the_context_and_is_hidden_from_the_model() -> None:
    seen: list[ToolContext] = []

    @tool
    async def whoami(greeting: str, ctx: ToolContext) -> str:
        seen.append(ctx)
        return f"{greeting} {ctx.principal}"

    assert list(properties(whoami)) == ["greeting"]
    assert whoami.schema["required"] == ["greeting"]
    outcome = await whoami.call('{"greeting": "hi"}', CTX)
    assert (outcome.status, outcome.content) == ("ok", "hi team-a")
    assert seen == [CTX]


async def test_a_context_sent_by_the_model_is_not_accepted_as_an_argument() -> None:
    @tool
    def whoami(ctx: ToolContext) -> str:
        return ctx.tool_call_id

    outcome = await whoami.call('{"ctx": "forged"}', CTX)
    assert (outcome.status, outcome.content) == ("ok", "call-1")


# --- execution ---------------------------------------------------------------------------------


async def test_async_function_executes_on_the_loop() -> None:
    @tool
    async def add(a: int, b: int = 1) -> int:
        return a + b

    outcome = await add.call('{"a": 2}', CTX)
    assert (outcome.status, outcome.content, outcome.processed_content) == ("ok", "3", 3)


async def test_sync_function_executes_in_a_thread() -> None:
    threads: list[int] = []

    @tool
    def add(a: int, b: int = 1) -> int:
        threads.append(threading.get_ident())
        return a + b

    outcome = await add.call({"a": 2, "b": 5}, CTX)
    assert (outcome.status, outcome.processed_content) == ("ok", 7)
    assert threads != [threading.get_ident()]


async def test_arguments_are_validated_and_coerced_by_the_signature() -> None:
    @tool
    def save(person: Person, count: int) -> str:
        assert isinstance(person, Person)
        return f"{person.address.street} x{count}"

    ok = await save.call('{"person": {"name": "a", "address": {"street": "Main", "title": "Dr"}}, "count": "3"}',
                            CTX)
    assert (ok.status, ok.content) == ("ok", "Main x3")
    bad = await save.call('{"persn": {}, "count": "many"}', CTX)
    assert bad.status == "rejected"
    assert "- person: missing (required)" in bad.content
    assert "- count: Input should be a valid integer" in bad.content
    assert "Unrecognized: persn (did you mean 'person'?)" in bad.content


# --- declarations that cannot work --------------------------------------------------------------


def star_args(*paths: str) -> str:
    return ""


def star_kwargs(**options: str) -> str:
    return ""


def positional_only(path: str, /) -> str:
    return path


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (star_args, "tool 'star_args': *args and **kwargs cannot be described to a model"),
        (star_kwargs, "tool 'star_kwargs': *args and **kwargs cannot be described to a model"),
        (positional_only, "tool 'positional_only': parameter 'path' is positional-only"),
    ],
)
def test_signatures_a_model_cannot_call_fail_at_build_time(fn: Any, message: str) -> None:
    with pytest.raises(ToolDeclarationError) as info:
        tool(fn)
    assert message in str(info.value)


def test_an_unschemable_annotation_fails_naming_the_tool() -> None:
    def takes_lock(lock: threading.Event) -> str:
        return ""

    with pytest.raises(ToolDeclarationError, match="tool 'takes_lock': its signature has no JSON schema"):
        tool(takes_lock)
