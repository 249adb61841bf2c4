"""What translating a request costs (issue 56): a Claude Code-like Messages request (a system prompt,
16 tools with their schemas, a conversation of a tool loop) written as Chat Completions, and its
answer read back, whole and streamed, as CPU per request, beside a baseline every request pays in
the same run: decoding and encoding that request's JSON with orjson.

    python bench/translation.py [--requests 2000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.translate.chat import CHAT
from gateway.translate.neutral import (
    ArgumentsDelta,
    Finished,
    PartEnded,
    PartStarted,
    Started,
    StreamEvent,
    Text,
    TextDelta,
    ToolCall,
    Usage,
)
from gateway.translate.pairs import Translation

SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "description": "The file to read"},
                                           "offset": {"type": "integer"}, "limit": {"type": "integer"}},
          "required": ["path"]}
TOOLS = [{"name": f"tool_{n}", "description": "Does one thing the agent needs, described at some length. " * 3,
          "input_schema": SCHEMA} for n in range(16)]
CONVERSATION = [
    {"role": "user", "content": "Read the config and tell me which port the server uses."},
    {"role": "assistant", "content": [{"type": "text", "text": "Reading it."},
                                      {"type": "tool_use", "id": "toolu_01", "name": "tool_0",
                                       "input": {"path": "/etc/app/config.toml"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                  "content": "[server]\nport = 8080\n" * 20}]},
    {"role": "assistant", "content": [{"type": "text", "text": "The server listens on 8080."}]},
    {"role": "user", "content": "And the log level?"}]
REQUEST = {"model": "claude-sonnet-4-5", "max_tokens": 8192, "system": "You are a careful agent. " * 40,
           "tools": TOOLS, "messages": CONVERSATION, "stream": False}
ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "qwen3",
          "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
              "role": "assistant", "content": "Checking the logging section.",
              "tool_calls": [{"id": "call_1", "type": "function",
                              "function": {"name": "tool_0", "arguments": '{"path": "/etc/app/config.toml"}'}}]}}],
          "usage": {"prompt_tokens": 1500, "completion_tokens": 40, "total_tokens": 1540}}


def _stream_chunks() -> list[dict[str, Any]]:
    """The answer as a Chat server streams it: its text in 20 pieces, its call's arguments in 8."""
    writing = CHAT.stream_writing()
    events: list[StreamEvent] = [Started("chatcmpl-1", "qwen3"), PartStarted(0, Text(""))]
    events += [TextDelta(0, "word ") for _ in range(20)]
    events += [PartEnded(0), PartStarted(1, ToolCall("call_1", "tool_0", ""))]
    events += [ArgumentsDelta(1, '{"pa' if n == 0 else 'th": "/a"}' if n == 7 else "") for n in range(8)]
    events += [PartEnded(1), Finished("tool_calls", Usage(1500, 40))]
    return [chunk for event in events for chunk in writing.write(event)]


async def _replayed(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for chunk in chunks:
        yield chunk


def per_request(step: Callable[[], object], count: int) -> float:
    started = time.process_time()
    for _ in range(count):
        step()
    return (time.process_time() - started) / count


def main(requests: int, repeats: int) -> None:
    pair = Translation("messages", "chat")
    raw, chunks = orjson.dumps(REQUEST), _stream_chunks()

    def streamed() -> object:
        async def drain() -> int:
            return len([event async for event in pair.events(_replayed(chunks))])
        return asyncio.run(drain())

    cases: dict[str, Callable[[], object]] = {
        "baseline: orjson loads + dumps of the request": lambda: orjson.dumps(orjson.loads(raw)),
        "the request, Messages -> Chat": lambda: pair.request(REQUEST),
        "the answer, Chat -> Messages": lambda: pair.answer(ANSWER),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, step in cases.items():
            results[name].append(per_request(step, requests))
    base = statistics.median(results["baseline: orjson loads + dumps of the request"])
    print(f"request: {len(raw)} bytes, {len(TOOLS)} tools; stream: {len(chunks)} chunks")
    for name in cases:
        cost = statistics.median(results[name])
        print(f"{name:48} {cost * 1e6:8.1f} µs  {cost / base:5.2f}x the baseline")
    loop_cost = per_request(lambda: asyncio.run(asyncio.sleep(0)), requests // 10)  # asyncio.run's own cost
    stream = statistics.median(per_request(streamed, requests // 10) for _ in range(repeats)) - loop_cost
    print(f"{'the streamed answer, Chat -> Messages':48} {stream * 1e6:8.1f} µs  {stream / base:5.2f}x the baseline"
          f" ({stream / len(chunks) * 1e6:.2f} µs a chunk)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=9)
    options = parser.parse_args()
    main(options.requests, options.repeats)
