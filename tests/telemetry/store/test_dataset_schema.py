"""The dataset's contract (telemetry.store.dataset_schema) is what docs/dataset.schema.json ships
and what docs/datasets.md describes, field by field; and whatever GenAI messages a store holds,
their chat messages (telemetry.store.chat_format) fit it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from telemetry.store.chat_format import chat_messages, function_tools
from telemetry.store.dataset_schema import dataset_schema, schema_text

DOCS = Path(__file__).resolve().parents[3] / "docs"
REGENERATE = "python -m telemetry.store.dataset_schema docs/dataset.schema.json"


def test_the_docs_ship_the_schema() -> None:
    assert (DOCS / "dataset.schema.json").read_text(encoding="utf-8") == schema_text(), (
        f"docs/dataset.schema.json is out of date with telemetry/store/dataset_schema.py: run `{REGENERATE}`")
    Draft202012Validator.check_schema(dataset_schema())


def _fields(schema: Any) -> Iterator[str]:
    """Every property name the schema declares, at any depth."""
    if isinstance(schema, dict):
        yield from schema.get("properties", {})
        for value in schema.values():
            yield from _fields(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _fields(value)


def test_the_docs_describe_every_field() -> None:
    page = (DOCS / "datasets.md").read_text(encoding="utf-8")
    fields = set(_fields(dataset_schema()))
    assert {"messages", "tools", "labels", "source", "tool_calls", "corrected_arguments", "context"} <= fields
    undescribed = sorted(field for field in fields if f"| `{field}` |" not in page)
    assert not undescribed, f"docs/datasets.md has no row for {undescribed}"


def _validator(field: str) -> Draft202012Validator:
    """A validator of one top-level field of a line (its definitions beside it)."""
    schema = dataset_schema()
    return Draft202012Validator({**schema["properties"][field], "$defs": schema["$defs"]})


_TEXT = st.text(max_size=12)
_ARGUMENTS = st.one_of(_TEXT, st.dictionaries(_TEXT, st.one_of(_TEXT, st.integers()), max_size=3))
_PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "content": _TEXT}),
    st.fixed_dictionaries({"type": st.just("tool_call"), "id": _TEXT, "name": _TEXT, "arguments": _ARGUMENTS}),
    st.fixed_dictionaries({"type": st.just("tool_call_response"), "id": _TEXT, "response": _TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "input_image", "file"])}))
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"]),
                                  "parts": st.lists(_PART, max_size=4)})


@given(st.lists(_MESSAGE, min_size=1, max_size=6))
def test_any_captured_messages_become_chat_messages_that_fit(messages: list[dict[str, Any]]) -> None:
    chat = chat_messages(messages, ("password",))
    errors = [error.message for error in _validator("messages").iter_errors(chat)] if chat else []
    assert not errors
    # nothing said is lost: every call and every answer has its message
    calls = [p for m in messages if m["role"] == "assistant" for p in m["parts"] if p["type"] == "tool_call"]
    answers = [p for m in messages for p in m["parts"] if p["type"] == "tool_call_response"]
    assert len([c for m in chat for c in m.get("tool_calls", ())]) == len(calls)
    assert len([m for m in chat if m["role"] == "tool"]) == len(answers)


def test_responses_calls_join_their_assistant_message() -> None:
    """The Responses API gives each call an item, so the store a message each: one assistant turn."""
    def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
        return {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": name,
                                                "arguments": arguments}]}

    messages = [{"role": "user", "parts": [{"type": "text", "content": "hi"}, {"type": "input_image"}]},
                {"role": "assistant", "parts": [{"type": "reasoning", "content": "hmm"},
                                                {"type": "text", "content": "ok"}]},
                call("a", "f", {"x": 1}), call("b", "g", "not json"),
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "a", "response": "1"},
                                           {"type": "tool_call_response", "id": "b", "response": "2"}]}]
    assert chat_messages(messages, ()) == [
        {"role": "user", "content": "hi\n[input_image]"},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"}]


def test_only_function_tools_are_declared() -> None:
    definitions = [{"type": "function", "name": "f", "description": "F.", "parameters": {"type": "object"}},
                   {"type": "web_search", "name": "web_search"}, {"type": "function", "name": "g"}, "junk"]
    tools = function_tools(definitions, ())
    assert tools == [{"type": "function", "function": {"name": "f", "description": "F.",
                                                       "parameters": {"type": "object"}}},
                     {"type": "function", "function": {"name": "g"}}]
    assert not list(_validator("tools").iter_errors(tools))
