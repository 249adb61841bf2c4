"""Reading a Chat Completions answer as a turn (gateway.apis.chat.answer): JSON and streams, what a
stream shows the client at once, and, however a stream is cut into deltas (its text anywhere, the
fragments of parallel calls interleaved in any order), the same answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis.chat.answer import ChatStreamReader, read_chat
from gateway.errors import UpstreamUnavailable
from tests.apis.conftest import CALLS, TEXT, _pieces
from tests.conftest import _assembled, _feed


@pytest.mark.parametrize("body", [
    None, [], {}, {"choices": []}, {"choices": ["x"]}, {"choices": [{"message": "hi"}]},
    {"choices": [{"message": {"tool_calls": "x"}}]},
    {"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]},
], ids=["null", "list", "empty", "no-choices", "choice-not-object", "message-not-object", "calls-not-list",
        "call-without-name"])
def test_a_chat_completion_of_the_wrong_shape_is_the_providers_fault(body: Any) -> None:
    with pytest.raises(UpstreamUnavailable, match="wrong shape"):
        read_chat(body)


def test_arguments_sent_as_an_object_are_read_as_json_text() -> None:
    turn = read_chat({"choices": [{"message": {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}}]})
    assert turn.calls[0].arguments == '{"a":1}'


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "c-1", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra}


def test_a_chat_stream_shows_content_and_holds_calls_finish_and_usage() -> None:
    reader = ChatStreamReader()
    shown = [reader.absorb(c) for c in (
        chunk({"role": "assistant", "content": ""}, system_fingerprint="fp_1"),
        {**chunk({"content": "Hel"}), "choices": [{"index": 0, "delta": {"content": "Hel"}, "logprobs": {"content": []},
                                                   "finish_reason": None}]},
        chunk({"content": ""}),
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "add", "arguments": '{"a":'}}]}),
        chunk({"content": "lo", "tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        chunk({}, "tool_calls"),
        {"id": "c-1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    )]
    assert shown[0] is not None
    assert shown[0]["system_fingerprint"] == "fp_1"  # the provider's fields stay
    assert shown[1] is not None
    assert shown[1]["choices"][0]["logprobs"] == {"content": []}
    assert [s is None for s in shown] == [False, False, True, True, False, True, True]
    assert shown[4] is not None
    assert shown[4]["choices"][0]["delta"] == {"content": "lo"}  # the call's fragment is held back
    turn = reader.turn()
    assert turn.output[0]["content"] == "Hello"
    assert [(c.name, c.arguments) for c in turn.calls] == [("add", '{"a":1}')]
    assert (turn.finish_reason, turn.input_tokens, turn.output_tokens) == ("tool_calls", 4, 2)


def test_a_chat_stream_without_a_finish_reason_was_cut_short() -> None:
    reader = ChatStreamReader()
    reader.absorb(chunk({"content": "Hel"}))
    with pytest.raises(UpstreamUnavailable, match="without a finish reason"):
        reader.turn()


@st.composite
def chat_stream(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An answer (content, reasoning, tool calls) and one stream of chunks that says it, its text
    cut anywhere and its calls' fragments interleaved in any order (each call's own in order)."""
    content, reasoning, calls = draw(TEXT), draw(TEXT), draw(CALLS)
    cuts = st.lists(st.integers(min_value=0), max_size=6)
    deltas: list[dict[str, Any]] = [{"reasoning_content": p} for p in _pieces(reasoning, draw(cuts))]
    deltas += [{"content": p} for p in _pieces(content, draw(cuts))]
    fragments = [[{"index": i, "id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": ""}}]
                 + [{"index": i, "function": {"arguments": p}} for p in _pieces(arguments, draw(cuts))]
                 for i, (name, arguments) in enumerate(calls)]
    while any(fragments):  # interleave the calls, keeping each call's fragments in order
        pending = [queue for queue in fragments if queue]
        deltas.append({"tool_calls": [draw(st.sampled_from(pending)).pop(0)]})
    chunks = [{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
              for delta in [{"role": "assistant", "content": ""}, *deltas]]
    chunks.append({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]})
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                  "function": {"name": name, "arguments": arguments}}
                                 for i, (name, arguments) in enumerate(calls)]
    return message, chunks


@settings(max_examples=150, deadline=None)
@given(stream=chat_stream())
def test_any_split_of_an_answer_into_deltas_assembles_it(stream: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    message, chunks = stream
    data = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
    shown, turn = _assembled(_feed([data]))
    assembled = turn.body["choices"][0]["message"]
    assert {k: v for k, v in assembled.items() if v not in ("", None) or k == "content"} == message
    assert [(c.id, c.name, c.arguments) for c in turn.calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    # The text reached the client as it came, and no tool-call fragment did.
    assert "".join(s["choices"][0]["delta"].get("content", "") for s in shown) == (message["content"] or "")
    assert not any("tool_calls" in s["choices"][0]["delta"] for s in shown)
