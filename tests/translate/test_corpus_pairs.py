"""The recorded provider answers of tests/corpus (OpenAI, Azure, vLLM, DeepSeek, llama.cpp in Chat
Completions; Anthropic in Messages) through every translation to a client of another API, whole and
streamed: what docs/translation.md's table carries arrives, field by field — the text, each call's
id, name and arguments, why it stopped, the tokens — and the stream and the whole answer give the
client the same message."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.translate.neutral import Answer, Text, ToolCall
from gateway.translate.pairs import SIDES, TRANSLATED_TO, Translation
from tests.conftest import _feed
from tests.translate.messages_cases import assembled, read_stream

CORPUS = Path(__file__).parents[1] / "corpus"
RECORDED = {"chat": ["openai_logprobs", "openai_refusal", "azure_content_filter", "deepseek_reasoner",
                     "vllm_reasoning", "vllm_continuous_usage", "llamacpp_object_arguments"],
            "messages": ["anthropic_text", "anthropic_tool_use", "anthropic_thinking", "anthropic_redacted_thinking"]}
PAIRS = [(client, provider, name) for client, targets in TRANSLATED_TO.items() for provider in targets
         for name in RECORDED.get(provider, ())]


def _said(answer: Answer) -> dict[str, Any]:
    """What every API carries of an answer (docs/translation.md): text, calls, stop, tokens."""
    return {"text": "".join(p.text for p in answer.parts if isinstance(p, Text)),
            "calls": [(p.call_id, p.name, json.loads(p.arguments or "{}")) for p in answer.parts
                      if isinstance(p, ToolCall)],
            "stop": answer.stop, "input": answer.usage.input_tokens, "output": answer.usage.output_tokens}


async def _through(pair: Translation, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async def replayed() -> AsyncIterator[dict[str, Any]]:
        for event in events:
            yield event
    return [event async for event in pair.events(replayed())]


def _recorded_events(name: str) -> list[dict[str, Any]]:
    return list(_feed([(CORPUS / f"{name}.sse").read_bytes()]))


@pytest.mark.parametrize(("client", "provider", "name"), PAIRS, ids=[f"{p}->{c}:{n}" for c, p, n in PAIRS])
def test_a_recorded_answer_reaches_a_client_of_another_api(client: str, provider: str, name: str) -> None:
    pair = Translation(client, provider)
    recorded = SIDES[provider].read_answer(json.loads((CORPUS / f"{name}.json").read_text()))
    whole = SIDES[client].read_answer(json.loads(json.dumps(pair.answer(json.loads(
        (CORPUS / f"{name}.json").read_text())))))
    assert _said(whole) == _said(recorded)
    streamed = assembled(read_stream(SIDES[client].stream_reading(),
                                     asyncio.run(_through(pair, _recorded_events(name)))))
    assert _said(streamed) == _said(whole)
