"""Property: however a provider's stream is cut, the gateway assembles the same answer.

Two cuts, both arbitrary: the bytes of the SSE stream split into network reads anywhere (inside
an event, a line ending or a multi-byte character), and an answer's text and tool-call arguments
split into any number of deltas, with the fragments of parallel calls interleaved in any order.
The bytes reach the SSE reader one read at a time, as the provider's connection delivers them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis.chat.answer import ChatStreamReader
from gateway.apis.messages.answer import MessagesStreamReader
from gateway.apis.responses.answer import ResponsesStreamReader
from gateway.engine.turn import ModelTurn
from gateway.provider.client import sse_events

CORPUS = Path(__file__).parents[1] / "corpus"
RECORDINGS = sorted(path for path in CORPUS.glob("*.sse") if "error" not in path.stem)  # streams that complete
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # any character that can travel as UTF-8


def _feed(pieces: Sequence[bytes]) -> list[dict[str, Any]]:
    """The events `pieces`, read one after the other from the connection, decode to."""
    async def reads() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def read() -> list[dict[str, Any]]:
        return [event async for event in sse_events(reads())]
    return asyncio.run(read())


def _assembled(events: list[dict[str, Any]]) -> tuple[list[Any], ModelTurn]:
    """What the client sees at once, and the turn, of a stream of Chat chunks, Responses events or
    Messages events."""
    kind = str(events[0].get("type", ""))
    reader = (ResponsesStreamReader() if kind.startswith("response.") else MessagesStreamReader() if kind
              else ChatStreamReader())
    shown = [piece for event in events if (piece := reader.absorb(event)) is not None]
    return shown, reader.turn()


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=60, deadline=None)
@given(recording=st.sampled_from(RECORDINGS), cuts=st.lists(st.integers(min_value=0), max_size=40))
def test_any_split_of_a_recorded_stream_into_reads_assembles_the_same(recording: Path, cuts: list[int]) -> None:
    data = recording.read_bytes()
    whole_shown, whole_turn = _assembled(_feed([data]))
    shown, turn = _assembled(_feed(_split(data, cuts)))
    assert shown == whole_shown
    assert turn.body == whole_turn.body
    assert turn.calls == whole_turn.calls


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_every_byte_of_a_stream_read_alone_assembles_the_same(cuts: list[int]) -> None:
    data = (CORPUS / "vllm_reasoning.sse").read_bytes().replace(b"9.11", "9.11 é ✓ 𝄞".encode())
    one_by_one = [data[i:i + 1] for i in range(len(data))]
    assert _assembled(_feed(one_by_one))[1].body == _assembled(_feed(_split(data, cuts)))[1].body
    assert "𝄞" in str(_assembled(_feed(one_by_one))[1].body)


# --- deltas ------------------------------------------------------------------------------------------

def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({cut % (len(text) + 1) for cut in cuts})
    return [text[start:end] for start, end in zip([0, *points], [*points, len(text)], strict=True)]


CALLS = st.lists(st.tuples(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), TEXT), max_size=3)


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
