"""The dataset (telemetry.store.dataset) of calls whose models did what the two-model session does
not: gave the calls of different turns one id, and sent arguments JSON has no number for."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.demo.model import Reply
from tests.conftest import USER, Stack, StackFactory
from tests.improve.conftest import export

TRAJECTORY = {"X-Trajectory-Id": "one-id-for-all"}


def calling(model: str, call_id: str, tool: str, arguments: str) -> Reply:
    """An upstream answer that makes one call, of the id given (the scripted model numbers its own)."""
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
    return Reply(raw=json.dumps({
        "id": f"chatcmpl-{call_id}-{arguments}", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                     "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode())


async def _ask(stack: Stack, model: str, *replies: Reply) -> None:
    stack.script.then(*replies, Reply(content="done"))
    answer = await stack.client.chat.completions.create(model=model, messages=USER,  # type: ignore[arg-type]
                                                        extra_headers=TRAJECTORY)
    assert answer.choices[0].message.content == "done"


def _last_call(example: dict[str, Any]) -> dict[str, Any]:
    """The call the example's messages end with."""
    [call] = example["messages"][-1]["tool_calls"]
    return call  # type: ignore[no-any-return]


@pytest.mark.parametrize("rounds", ["recorded", "lost"])
async def test_calls_of_one_id_each_get_their_own_turn(make_stack: StackFactory, tmp_path: Path, rounds: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Every call is `call_0`: model-a's rejected call and its correction, in two rounds of one
    request, then model-b's call in the next request of the trajectory. Each example is its own
    call's turn: the conversation ending with that call, that turn's model. With the calls' rounds
    lost (a store another writer filled), the latest turn before the call holding the id is it."""
    stack = await make_stack(capture_message_content=True, record_tool_arguments=True)
    await _ask(stack, "model-a", calling("model-a", "call_0", "read_file", '{"file_path": "/a"}'),
               calling("model-a", "call_0", "read_file", '{"path": "/a"}'))
    await _ask(stack, "model-b", calling("model-b", "call_0", "read_file", '{"path": "/b"}'))
    await stack.observability.store.flushed()  # type: ignore[union-attr]
    store = stack.observability.store.path  # type: ignore[union-attr]
    if rounds == "lost":
        with sqlite3.connect(store) as db:
            db.execute("UPDATE tool_calls SET round = NULL")
    examples = export(store, tmp_path / "calls.jsonl", capsys)
    shown = [(e["source"]["model"], e["labels"]["outcome"], e["labels"]["arguments"],
              json.loads(_last_call(e)["function"]["arguments"])) for e in examples]
    assert shown == [("model-a", "rejected", {"file_path": "/a"}, {"file_path": "/a"}),
                     ("model-a", "ok", {"path": "/a"}, {"path": "/a"}),
                     ("model-b", "ok", {"path": "/b"}, {"path": "/b"})]
    rejected = examples[0]
    assert [m["role"] for m in rejected["messages"]] == ["user", "assistant"]  # its own turn: nothing after it
    assert rejected["labels"]["corrected_arguments"] == {"path": "/a"}
    # --model keeps the calls of that model's turns
    by_a = export(store, tmp_path / "a.jsonl", capsys, "--model", "model-a")
    assert [e["labels"]["arguments"] for e in by_a] == [{"file_path": "/a"}, {"path": "/a"}]
    by_b = export(store, tmp_path / "b.jsonl", capsys, "--model", "model-b")
    assert [e["labels"]["arguments"] for e in by_b] == [{"path": "/b"}]
    [pair] = export(store, tmp_path / "pairs.jsonl", capsys, "--pairs")
    assert (pair["source"]["model"], pair["labels"]["arguments"]) == ("model-a", {"file_path": "/a"})
    assert json.loads(_last_call(pair)["function"]["arguments"]) == {"path": "/a"}


# Arguments Python's json takes and JSON has no number for: kept as the text the model sent.
NOT_JSON = ['{"path": "/a", "offset": NaN}', '{"a": Infinity, "b": -Infinity}']
DECLARED = ('[{"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": '
            '{"offset": {"type": "integer", "default": NaN}}}}]')


async def test_numbers_json_has_not_are_kept_as_text(make_stack: StackFactory, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Every line stays JSON (the helper reads it refusing NaN and Infinity): the arguments as
    recorded on the calls' spans, and as the captured answers hold them (arguments not recorded);
    a NaN elsewhere (a declared default another writer stored) as its text."""
    stack = await make_stack(capture_message_content=True, record_tool_arguments=True)
    await _ask(stack, "model-a", calling("model-a", "call_0", "read_file", NOT_JSON[0]),
               calling("model-a", "call_1", "add", NOT_JSON[1]))
    await stack.observability.store.flushed()  # type: ignore[union-attr]
    store = stack.observability.store.path  # type: ignore[union-attr]
    for recorded in (True, False):
        if not recorded:
            with sqlite3.connect(store) as db:
                db.execute("UPDATE tool_calls SET arguments = NULL")
                db.execute("UPDATE model_turns SET tool_definitions = ?", (DECLARED,))
        examples = export(store, tmp_path / f"calls-{recorded}.jsonl", capsys)
        assert [e["labels"]["arguments"] for e in examples] == NOT_JSON
        assert [_last_call(e)["function"]["arguments"] for e in examples] == NOT_JSON
        assert {e["labels"]["context"] for e in examples} == {"captured"}
    offset = examples[0]["tools"][0]["function"]["parameters"]["properties"]["offset"]
    assert offset == {"type": "integer", "default": "NaN"}
