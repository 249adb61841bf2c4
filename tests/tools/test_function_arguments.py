"""Decoding a call's arguments (read_arguments and the parse step), as properties: whatever text or
object arrives, the result is a dict a tool can take or a Rejection saying why, never an
exception; too deep or too large is refused in words a model can act on; text that is not valid
Unicode (lone surrogates, which JSON escapes can carry) never reaches a tool or the model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gateway.tools import Param, Parsed, Rejection, Tool, ToolContext, ToolOutcome, ToolResult, read_arguments
from gateway.tools.arguments import MAX_ARGUMENT_DEPTH

CTX = ToolContext(tool_call_id="call-1")

# Any code point, lone surrogates included (hypothesis leaves them out of st.text() by default).
SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
ANY_CHARACTER = st.characters(codec=None, exclude_categories=()) | SURROGATE  # drawn often enough to matter
WILD_TEXT = st.text(ANY_CHARACTER, max_size=20)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | WILD_TEXT
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(WILD_TEXT, inner, max_size=4), max_leaves=20)
JSON_OBJECTS = st.dictionaries(WILD_TEXT, JSON_VALUES, max_size=5)


class Invoice(BaseModel):
    vendor_name: str
    total: float


TOOLS = [
    Tool(name="plain", function=lambda args: "ok"),
    Tool(name="params", function=lambda args: "ok",
         parameters=[Param("path", "string", required=True), Param("tags", "array", item_type="string")]),
    Tool(name="model", function=lambda args: "ok", args_model=Invoice),
    Tool(name="strict", function=lambda args: "ok", strict=True, parameters=[Param("path", "string")]),
]


def is_valid_unicode(value: Any) -> bool:
    """Every string in `value` (keys too) encodes as UTF-8, as JSON on the wire must."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(is_valid_unicode(k) and is_valid_unicode(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_valid_unicode(item) for item in value)
    return True


def nested(depth: int, kinds: list[bool]) -> Any:
    """Objects and arrays nested `depth` levels deep (the outermost an object); `kinds` says, level
    by level below the top, whether it is an array."""
    value: Any = 1
    for is_array in reversed(kinds[:depth - 1]):
        value = [value] if is_array else {"k": value}
    return {"top": value}


# --- any input: a dict or a Rejection ---------------------------------------------------------------


@given(JSON_VALUES)
def test_any_json_text_gives_a_valid_dict_or_a_rejection(value: Any) -> None:
    decoded = read_arguments("t", json.dumps(value))  # ensure_ascii: lone surrogates as \\u escapes
    if isinstance(decoded, Rejection):
        assert decoded.reason == "invalid_json"
        assert not isinstance(value, dict)
        assert decoded.message.startswith("Tool 't': the arguments must be a JSON object")
    else:
        assert isinstance(value, dict)
        assert is_valid_unicode(decoded)


@given(st.text(ANY_CHARACTER))
def test_any_text_gives_a_valid_dict_or_a_rejection(raw: str) -> None:
    decoded = read_arguments("t", raw)
    assert isinstance(decoded, dict | Rejection)
    if isinstance(decoded, dict):
        assert is_valid_unicode(decoded)


@given(JSON_OBJECTS)
def test_any_object_gives_a_valid_dict(value: dict[str, Any]) -> None:
    decoded = read_arguments("t", value)
    assert isinstance(decoded, dict)
    assert is_valid_unicode(decoded)


@given(st.sampled_from(TOOLS), JSON_VALUES | st.text(ANY_CHARACTER), st.booleans())
def test_the_parse_step_gives_parsed_arguments_or_a_rejection(tool: Tool, value: Any, as_text: bool) -> None:
    raw = json.dumps(value) if as_text or not isinstance(value, dict) else value
    parsed = asyncio.run(tool.parse_arguments(raw, CTX))
    assert isinstance(parsed, Parsed | Rejection)
    if isinstance(parsed, Parsed):
        assert is_valid_unicode(parsed.arguments)
    else:
        assert parsed.message.startswith(f"Tool '{tool.name}':")
        assert is_valid_unicode(parsed.message)


# --- lone surrogates ----------------------------------------------------------------------------------


@given(st.text(max_size=20), SURROGATE, st.text(max_size=20))  # st.text() draws no surrogates itself
def test_a_lone_surrogate_reaches_the_tool_as_the_replacement_character(before: str, lone: str,
                                                                         after: str) -> None:
    assert read_arguments("t", json.dumps({"text": before + lone + after})) == {"text": before + "\ufffd" + after}


def test_a_surrogate_pair_written_as_two_escapes_is_one_character() -> None:
    assert read_arguments("t", '{"t": "\\ud83d\\ude00", "lone": "a\\udcffb"}') == {"t": "\U0001F600",
                                                                                   "lone": "a\ufffdb"}


def test_a_lone_surrogate_in_a_key_is_replaced_too() -> None:
    assert read_arguments("t", '{"\\ud800": 1}') == {"\ufffd": 1}


@pytest.mark.parametrize("result", [
    "a\udcffb",
    ToolResult(content="a\udcffb"),
    ToolResult(content=[{"type": "text", "text": "a\udcffb"}]),
], ids=["string", "tool-result", "content-parts"])
async def test_a_tool_result_with_a_lone_surrogate_is_valid_content(result: Any) -> None:
    outcome = await Tool(name="t", function=lambda args: result).call("{}", CTX)
    assert outcome.status == "ok"
    assert "a\ufffdb" in outcome.content_text()
    assert is_valid_unicode(outcome.content)


async def test_a_native_result_with_a_lone_surrogate_is_encoded_with_the_replacement() -> None:
    value = {"name": "report\udcff.txt"}  # as os.listdir gives a file name that is not UTF-8
    outcome = await Tool(name="t", function=lambda args: value).call("{}", CTX)
    assert outcome.status == "ok"
    assert json.loads(str(outcome.content)) == {"name": "report\ufffd.txt"}
    assert outcome.processed_content is value  # the application keeps what the tool returned


@given(st.sampled_from(["ok", "error", "rejected", "timeout", "interrupted"]), st.text(ANY_CHARACTER))
def test_every_outcome_content_is_valid_unicode(status: Any, content: str) -> None:
    assert is_valid_unicode(ToolOutcome(call_id="c", tool_name="t", status=status, content=content).content)


# --- too deep, too large ------------------------------------------------------------------------------


@given(st.integers(1, 3 * MAX_ARGUMENT_DEPTH), st.lists(st.booleans(), min_size=3 * MAX_ARGUMENT_DEPTH,
                                                          max_size=3 * MAX_ARGUMENT_DEPTH), st.booleans())
def test_nesting_beyond_the_limit_is_refused_with_the_limit_named(depth: int, kinds: list[bool],
                                                                  as_text: bool) -> None:
    value = nested(depth, kinds)
    decoded = read_arguments("t", json.dumps(value) if as_text else value)
    if depth <= MAX_ARGUMENT_DEPTH:
        assert decoded == value
    else:
        assert isinstance(decoded, Rejection)
        assert decoded.reason == "invalid_json"
        assert decoded.message == (f"Tool 't': the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep. "
                                   "Send them as a flatter JSON object of named parameters.")


@pytest.mark.parametrize("raw", ['{"a": ' * 100_000, "[" * 100_000, '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}"],
                         ids=["objects-unclosed", "arrays-unclosed", "arrays-closed"])
def test_nesting_deeper_than_python_reads_is_the_same_refusal(raw: str) -> None:
    decoded = read_arguments("t", raw)
    assert isinstance(decoded, Rejection)
    assert f"nested more than {MAX_ARGUMENT_DEPTH} levels deep" in decoded.message


@given(st.integers(4_301, 20_000), st.sampled_from(['{"n": %s}', '{"n": [1, -%s]}']))
def test_an_integer_too_long_to_read_is_refused(digits: int, template: str) -> None:
    decoded = read_arguments("t", template % ("9" * digits))
    assert isinstance(decoded, Rejection)
    assert decoded.message == ("Tool 't': the arguments hold a value too large to read. "
                               "Send them as one JSON object of named parameters with shorter values.")


def test_a_depth_limit_of_its_own_can_be_given() -> None:
    assert read_arguments("t", '{"a": {"b": 1}}', max_depth=2) == {"a": {"b": 1}}
    refused = read_arguments("t", '{"a": {"b": [1]}}', max_depth=2)
    assert isinstance(refused, Rejection)
    assert "nested more than 2 levels deep" in refused.message
