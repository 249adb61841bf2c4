"""Parameter aliases: declared four ways, renamed before the parse step, and refused when wrongly declared."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel

from gateway.tools import Alias, Param, Parsed, Rejection, Tool, ToolContext, ToolDeclarationError, ToolRegistry, tool

CONTEXT = ToolContext("call-1")


def _echo(args: dict[str, Any]) -> dict[str, Any]:
    return args


class Located(BaseModel):
    path: Annotated[str, Alias("file_path")]
    offset: int = 0


@tool
def read_file(path: Annotated[str, Alias("file_path", "filepath")], offset: int = 0) -> str:
    """Read a file."""
    return path


DECLARED = {
    "param": Tool(name="read", function=_echo, parameters=[
        Param("path", "string", required=True, aliases=["file_path"]), Param("offset", "integer")]),
    "annotated": read_file,
    "args_model": Tool(name="read", function=_echo, args_model=Located),
    "tool": Tool(name="read", function=_echo, aliases={"path": ["file_path"]},
                 parameters_schema={"type": "object", "properties": {"path": {"type": "string"}},
                                    "required": ["path"]}),
}


@pytest.mark.parametrize("style", DECLARED)
async def test_an_alias_is_taken_for_its_parameter_and_said(style: str) -> None:
    parsed = await DECLARED[style].parse_arguments({"file_path": "/a"}, CONTEXT)
    assert isinstance(parsed, Parsed)
    assert parsed.arguments["path"] == "/a"
    assert "file_path" not in parsed.arguments
    assert parsed.aliases == (("file_path", "path"),)


async def test_the_model_is_offered_only_the_parameters_own_names() -> None:
    for declared in DECLARED.values():
        assert "file_path" not in str(declared.schema)


@pytest.mark.parametrize("style", DECLARED)
async def test_a_parameter_sent_under_two_of_its_names_is_refused(style: str) -> None:
    """Which value was meant is the model's to say (an args_model dropped the alias's value, unsaid,
    until a review found it)."""
    refused = await DECLARED[style].parse_arguments({"path": "/a", "file_path": "/b"}, CONTEXT)
    assert isinstance(refused, Rejection)
    assert refused.reason == "schema_violation"
    assert "'path' and 'file_path' both name parameter 'path'" in refused.message


async def test_an_alias_beside_its_parameter_is_not_renamed() -> None:
    strict = Tool(name="read", function=_echo, validate_schema=True, parameters=[
        Param("path", "string", required=True, aliases=["file_path", "filepath"])],)
    both = await strict.parse_arguments({"path": "/a", "file_path": "/b"}, CONTEXT)  # which one is meant?
    assert isinstance(both, Rejection)
    assert both.names is not None
    assert both.names.unrecognized == ("file_path",)
    two_aliases = await strict.parse_arguments({"file_path": "/a", "filepath": "/b"}, CONTEXT)
    assert isinstance(two_aliases, Rejection)
    assert two_aliases.reason == "schema_violation"
    assert "'file_path' and 'filepath' both name parameter 'path'" in two_aliases.message


async def test_a_call_without_aliases_is_the_same_object_path() -> None:
    parsed = await DECLARED["param"].parse_arguments({"path": "/a"}, CONTEXT)
    assert isinstance(parsed, Parsed)
    assert parsed.aliases == ()
    assert parsed.arguments == {"path": "/a"}


@pytest.mark.parametrize(("aliases", "problem"), [
    ({"nope": ["x"]}, "not one of its parameters"),
    ({"path": ["offset"]}, "a parameter's own name"),
    ({"path": ["path"]}, "a parameter's own name"),
    ({"path": [""]}, "not a name"),
    ({"path": ["x" * 65]}, "not a name"),
    ({"path": [3]}, "not a name"),
])
def test_a_wrong_alias_fails_when_the_tool_is_built(aliases: dict[str, Any], problem: str) -> None:
    with pytest.raises(ToolDeclarationError, match=problem):
        Tool(name="read", function=_echo, aliases=aliases,
             parameters=[Param("path", "string"), Param("offset", "integer")])


def test_one_alias_for_two_parameters_fails() -> None:
    with pytest.raises(ToolDeclarationError, match="stands for both"):
        Tool(name="read", function=_echo, parameters=[Param("path", "string", aliases=["p"]),
                                                      Param("pattern", "string", aliases=["p"])])


def test_a_nested_property_takes_no_alias() -> None:
    with pytest.raises(ToolDeclarationError, match="only top-level"):
        Tool(name="read", function=_echo, parameters=[
            Param("options", "object", properties=[Param("depth", "integer", aliases=["level"])])])


async def test_the_operators_aliases_join_the_tools_now_and_later() -> None:
    plain = Tool(name="read", function=_echo, parameters=[Param("path", "string", required=True, aliases=["p"])])
    registry = ToolRegistry([plain])
    registry.use_aliases({"read": {"path": ["file_path"]}, "later": {"q": ["query"]}})
    read = registry.get("read")
    assert read is not None
    assert read.aliases == {"path": ["p", "file_path"]}
    registry.replace_source("server", [Tool(name="later", function=_echo, parameters=[Param("q", "string")]),
                                       Tool(name="other", function=_echo)])
    later = registry.get("later")
    assert later is not None
    assert later.alias_of == {"query": "q"}
    parsed = await later.parse_arguments({"query": "x"}, CONTEXT)
    assert isinstance(parsed, Parsed)
    assert parsed.arguments == {"q": "x"}


def test_an_operators_alias_that_fits_no_parameter_fails_at_start_up_or_is_left_out_later() -> None:
    registry = ToolRegistry([Tool(name="read", function=_echo, parameters=[Param("path", "string")])])
    with pytest.raises(ToolDeclarationError, match="not one of its parameters"):
        registry.use_aliases({"read": {"nope": ["x"]}})
    fresh = ToolRegistry()
    fresh.use_aliases({"later": {"nope": ["x"]}})
    fresh.replace_source("server", [Tool(name="later", function=_echo, parameters=[Param("q", "string")])])
    later = fresh.get("later")
    assert later is not None
    assert later.alias_of == {}


def test_an_operators_aliases_that_fit_a_later_tool_are_kept_beside_one_that_does_not(
        caplog: pytest.LogCaptureFixture) -> None:
    """A server listed `fs__read(path, length)`; the table expected a `lenght`: the `path` alias is
    kept (all were dropped, unsaid, until a review found it) and the other is warned of once."""
    registry = ToolRegistry()
    registry.use_aliases({"fs__read": {"path": ["file_path"], "lenght": ["len"]}})
    listed = [Tool(name="fs__read", function=_echo, parameters=[Param("path", "string"), Param("length", "integer")])]
    registry.replace_source("fs", listed)
    registry.replace_source("fs", listed)  # listed again: no second warning
    read = registry.get("fs__read")
    assert read is not None
    assert read.alias_of == {"file_path": "path"}
    warned = [record.getMessage() for record in caplog.records if "tool_aliases" in record.getMessage()]
    assert len(warned) == 1
    assert "lenght" in warned[0]
