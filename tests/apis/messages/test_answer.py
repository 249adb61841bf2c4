"""Reading an Anthropic Messages answer as a turn (gateway.apis.messages.answer): however its stream is
cut into deltas, the same message."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.apis.conftest import CALLS, TEXT, _pieces
from tests.conftest import _assembled, _feed


@st.composite
def messages_stream(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A message's blocks (thinking with its signature, text, tool calls with JSON input) and one
    Anthropic stream that says them, every text and every call's JSON cut anywhere."""
    thinking, text, calls = draw(TEXT), draw(TEXT), draw(CALLS)
    cuts = st.lists(st.integers(min_value=0), max_size=6)
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": thinking, "signature": "c2lnbmVk"})
    blocks.append({"type": "text", "text": text})
    blocks += [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"value": value}}
               for i, (name, value) in enumerate(calls)]
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
        "usage": {"input_tokens": 3, "output_tokens": 1}}}]
    for index, block in enumerate(blocks):
        kind = block["type"]
        start = {**block, "thinking": "", "signature": ""} if kind == "thinking" else {**block, "text": ""} \
            if kind == "text" else {**block, "input": {}}
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        if kind == "thinking":
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(thinking, draw(cuts))]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "text":
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(text, draw(cuts))]
        else:
            deltas = [{"type": "input_json_delta", "partial_json": p}
                      for p in _pieces(json.dumps(block["input"]), draw(cuts))]
        events += [{"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas]
        events += [{"type": "ping"}] if index == 0 else []
        events.append({"type": "content_block_stop", "index": index})
    events += [{"type": "message_delta", "delta": {"stop_reason": "tool_use" if calls else "end_turn"},
                "usage": {"output_tokens": 9}}, {"type": "message_stop"}]
    return blocks, events


@settings(max_examples=150, deadline=None)
@given(stream=messages_stream())
def test_any_split_of_a_message_into_deltas_assembles_it(stream: tuple[list[dict[str, Any]],
                                                                       list[dict[str, Any]]]) -> None:
    blocks, events = stream
    data = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    shown, turn = _assembled(_feed([data]))
    assert list(turn.output) == blocks  # thinking and its signature to the byte, inputs parsed whole
    assert [(c.id, c.name, json.loads(c.arguments)) for c in turn.calls] == [
        (b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    assert turn.usage == {"input_tokens": 3, "output_tokens": 9}
    # The text and thinking reached the client as they came, and no event of a tool_use block did.
    calls = {i for i, b in enumerate(blocks) if b["type"] == "tool_use"}
    assert not [s for s in shown if s.get("index") in calls]
    assert "".join(s["delta"].get("text", "") for s in shown if s["type"] == "content_block_delta") == text_of(blocks)


def text_of(blocks: list[dict[str, Any]]) -> str:
    return "".join(b["text"] for b in blocks if b["type"] == "text")
