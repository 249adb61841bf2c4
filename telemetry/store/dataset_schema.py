"""The JSON Schema of one line of a dataset (`toolspan trajectories export --format chat-jsonl`,
telemetry.store.dataset): the line's contract, which the tests check every exported line against
and docs/datasets.md describes field by field. docs/dataset.schema.json is this schema as written
by `python -m telemetry.store.dataset_schema docs/dataset.schema.json` (a test keeps them equal)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from telemetry import names

_TEXT_OR_NULL = {"type": ["string", "null"]}
_ANY_JSON = {"type": ["object", "array", "string", "number", "boolean", "null"]}
_SPAN_ID = {"type": "string", "pattern": "^[0-9a-f]{16}$"}


def _object(properties: dict[str, Any], description: str, required: list[str] | None = None) -> dict[str, Any]:
    """An object of exactly these properties, every one present unless `required` says otherwise."""
    return {"type": "object", "description": description, "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False}


def _described(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "description": description}


def _messages() -> dict[str, Any]:
    """The chat messages: text messages, the assistant's (text and calls), the tools' answers."""
    call = _object({
        "id": _described("the call's id, as the model gave it", {"type": "string"}),
        "type": {"const": "function"},
        "function": _object({
            "name": _described("the tool called", {"type": "string"}),
            "arguments": _described("the arguments as the model sent them: JSON text (masked)", {"type": "string"}),
        }, "what was called")}, "one call the assistant made")
    return {
        "text_message": _object({
            "role": {"enum": ["system", "developer", "user"]},
            "content": {"type": "string"}}, "a message of text"),
        "assistant_message": _object({
            "role": {"const": "assistant"},
            "content": _described("what the model said besides its calls", _TEXT_OR_NULL),
            "tool_calls": {"type": "array", "minItems": 1, "items": call},
        }, "the model's turn", required=["role", "content"]),
        "tool_message": _object({
            "role": {"const": "tool"},
            "tool_call_id": _described("the call answered", {"type": "string"}),
            "content": _described("what the model was told of the call", {"type": "string"}),
        }, "a call's result, as the model read it"),
    }


def _tool() -> dict[str, Any]:
    return _object({
        "type": {"const": "function"},
        "function": _object({
            "name": {"type": "string"},
            "description": {"type": "string"},
            "parameters": _described("its JSON Schema", {"type": "object"}),
        }, "the function", required=["name"])}, "a tool offered to the model")


def _labels() -> dict[str, Any]:
    return _object({
        "example": _described("call: one tool call; pair: a failed call and the call that corrected it",
                              {"enum": ["call", "pair"]}),
        "outcome": _described(f"the call's outcome (of a pair: the failed call's): {', '.join(names.OUTCOMES)}",
                              _TEXT_OR_NULL),
        "rejection_reason": _described("why parsing rejected the call", _TEXT_OR_NULL),
        "error_type": _described("the kind of failure", _TEXT_OR_NULL),
        "retry_kind": _described("the call retries an earlier failed call of its tool (of a pair: the correcting "
                                 "call's)", {"enum": ["verbatim", "corrected", None]}),
        "diagnostic": _described("what the model was told of the failure", _TEXT_OR_NULL),
        "arguments": _described("the call's arguments (of a pair: the failed call's), decoded when JSON", _ANY_JSON),
        "corrected_arguments": _described("of a failed call later corrected: the correcting call's arguments",
                                          _ANY_JSON),
        "context": _described("captured: the messages are the conversation the model saw; not_captured: only "
                              "the calls", {"enum": ["captured", "not_captured"]}),
    }, "what happened to the call")


def _source() -> dict[str, Any]:
    return _object({
        "trajectory_id": _described("the trajectory as the store keys it", {"type": "string"}),
        "key": _described("the gateway key's name", _TEXT_OR_NULL),
        "model": _described("the model the request asked for", _TEXT_OR_NULL),
        "upstream": _described("the configured upstream the turn went to", _TEXT_OR_NULL),
        "tool": {"type": "string"},
        "side": {"enum": [names.SIDE_GATEWAY, "client"]},
        "call_id": _TEXT_OR_NULL,
        "span_id": _SPAN_ID,
        "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "round": {"type": ["integer", "null"]},
        "started": _described("seconds since the epoch", {"type": "number"}),
        "corrected_call_id": _TEXT_OR_NULL,
        "corrected_span_id": {"anyOf": [_SPAN_ID, {"type": "null"}]},
    }, "where the call was recorded")


def dataset_schema() -> dict[str, Any]:
    """The schema of one line: a fresh copy each call."""
    line = _object({
        "messages": _described("the conversation up to and including the assistant message that made the call",
                               {"type": "array", "minItems": 1, "items": {"oneOf": [
                                   {"$ref": "#/$defs/text_message"}, {"$ref": "#/$defs/assistant_message"},
                                   {"$ref": "#/$defs/tool_message"}]}}),
        "tools": _described("the function tools offered to the model (empty when not captured)",
                            {"type": "array", "items": _tool()}),
        "labels": _labels(),
        "source": _source(),
    }, "One example of a tool call, in OpenAI's chat format, with what happened to it")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "toolspan chat-jsonl example",
            **line, "$defs": _messages()}


def schema_text() -> str:
    return json.dumps(dataset_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(schema_text(), encoding="utf-8")
