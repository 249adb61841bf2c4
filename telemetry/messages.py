"""Message content for the `chat {model}` spans, as the OpenTelemetry GenAI conventions shape it
(opt-in: `capture_message_content`).

- `gen_ai.input.messages`: the chat history sent in one provider call, a JSON array of
  `{"role", "parts"}`; a part is `{"type": "text", "content"}`, `{"type": "tool_call", "id",
  "name", "arguments"}` or `{"type": "tool_call_response", "id", "response"}`; any other content
  keeps only its type (an image or a file is not copied onto a span).
- `gen_ai.output.messages`: the model's answer, `[{"role": "assistant", "parts", "finish_reason"}]`.
- `gen_ai.system_instructions`: instructions sent apart from the history (the Responses API's
  `instructions`, the Messages API's `system`), `[{"type": "text", "content"}]`. A Chat system
  message stays in the history.
- `gen_ai.tool.definitions`: the tools the call offered the model (the gateway's and the client's),
  `[{"type": "function", "name", "description", "parameters"}]`, any other tool `{"type", "name"}`:
  what a dataset of the calls (telemetry.store.dataset) declares. A declaration keeps its structure
  (a `password` parameter is still declared); only the values a schema gives a secret property
  (a default, an enum ...) are masked.

Every API (Chat Completions messages, Responses input and output items, Messages content blocks,
their thinking as `reasoning` parts) comes out alike: each adapter reads its own API (its `genai`,
a gateway.instrumentation.MessageView); here its messages are made safe. Secrets
are masked as in tool arguments (`telemetry.arguments`), and each attribute is bounded: a string
part is cut to a little less than `max_chars`, then the oldest messages go until the JSON fits; every
tool keeps its type and name, and the first ones their description and parameters while they fit.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.instrumentation import MessageView
from telemetry import names
from telemetry.arguments import mask_text, masked, masked_schema

Message = dict[str, Any]

# Chat's finish reasons in the conventions' words (tool_calls -> tool_call); others pass as sent.
_FINISH_REASONS = {"tool_calls": "tool_call", "function_call": "tool_call"}


def output_message(view: MessageView, output: Sequence[Mapping[str, Any]], finish_reason: str | None) -> Message:
    """The answer as one assistant message: the parts of its output, as its API's view reads them."""
    reason = _FINISH_REASONS.get(finish_reason or "", finish_reason or "stop")
    return {"role": "assistant", "parts": view.answer_parts(output), "finish_reason": reason}


# --- masking and bounds -------------------------------------------------------------------------

def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + f"...[truncated; {len(text)} chars]"


def _safe_part(part: dict[str, Any], keys: Sequence[str], max_chars: int) -> dict[str, Any]:
    out = dict(part)
    for field in ("content", "response"):
        if isinstance(out.get(field), str):
            out[field] = _cut(mask_text(out[field], keys), max_chars)
    if "arguments" in out:
        arguments = masked(out["arguments"], keys)
        out["arguments"] = _cut(arguments, max_chars) if isinstance(arguments, str) else arguments
    return out


def _bounded_json(messages: list[Any], max_chars: int) -> str:
    """The JSON of `messages`, the oldest dropped until it fits (the newest is cut to a stub last)."""
    text = json.dumps(messages, ensure_ascii=False)
    while len(text) > max_chars and len(messages) > 1:
        messages = messages[1:]
        text = json.dumps(messages, ensure_ascii=False)
    if len(text) > max_chars:  # one message too big even with its strings cut: arguments nested deep
        stub: dict[str, Any] = {"type": "text", "content": f"[truncated; {len(text)} chars]"}
        if "role" in messages[0]:
            stub = {"role": messages[0]["role"], "parts": [stub]}
        text = json.dumps([stub])
    return text


_END = object()  # what an iterator of the walk below gives once it is done


def _longer_than(value: Any, limit: int) -> bool:
    """Whether the JSON of `value` is surely longer than `limit` characters: a lower bound of its
    length, summed as it is walked and the walk stopped past `limit`, so that weighing a value
    costs about `limit`, however large the value."""
    length, pending = 0, [iter((value,))]
    while pending:
        item = next(pending[-1], _END)
        if item is _END:
            pending.pop()
            continue
        length += len(item) + 2 if isinstance(item, str) else 2 if isinstance(item, dict | list) else 1
        if isinstance(item, dict):
            pending.append(itertools.chain.from_iterable(item.items()))
        elif isinstance(item, list):
            pending.append(iter(item))
        if length > limit:
            return True
    return False


def _bounded_definitions(definitions: list[dict[str, Any]], max_chars: int, keys: Sequence[str]) -> str:
    """The JSON of the tool definitions within `max_chars`: every tool's type and name first (what
    the conventions require; the last ones left out if even those do not fit), then each tool
    whole, masked, in order, while the room left takes it. Only what may fit is weighed, masked and
    written: the work is that of the bound, not of the list (a request's tools may be megabytes)."""
    kept: list[dict[str, Any]] = []
    size = 2  # the brackets
    for definition in definitions:
        head = {"type": definition["type"], "name": definition["name"]}
        more = len(json.dumps(head, ensure_ascii=False)) + (2 if kept else 0)  # and its separator
        if size + more > max_chars:
            break
        kept.append(head)
        size += more
    for i in range(len(kept)):
        head_size = len(json.dumps(kept[i], ensure_ascii=False))
        if _longer_than(definitions[i], max_chars - size + head_size):
            continue
        whole = masked_schema(definitions[i], keys)
        more = len(json.dumps(whole, ensure_ascii=False)) - head_size
        if size + more <= max_chars:
            kept[i], size = whole, size + more
    return json.dumps(kept, ensure_ascii=False)


@dataclass(frozen=True)
class MessageCapture:
    """Message content on the chat spans: masked with `redact_keys`, each attribute at most about
    `max_chars` characters."""

    max_chars: int = 16384
    redact_keys: Sequence[str] = ()

    def _safe(self, messages: list[Message]) -> list[Message]:
        keys, cut = self.redact_keys, max(64, self.max_chars - 256)  # room for the JSON around a text
        return [{**m, "parts": [_safe_part(p, keys, cut) for p in m["parts"]]} for m in messages]

    def request_attributes(self, view: MessageView, body: Mapping[str, Any]) -> dict[str, str]:
        """What goes on the span of the provider call that sent `body` (read through `view`, its API's)."""
        history = view.history(body)
        attributes = {names.ATTR_INPUT_MESSAGES: _bounded_json(self._safe(history), self.max_chars)}
        if (instructions := view.instructions(body)) is not None:
            parts = self._safe([{"role": "system", "parts": [{"type": "text", "content": instructions}]}])[0]["parts"]
            attributes[names.ATTR_SYSTEM_INSTRUCTIONS] = _bounded_json(parts, self.max_chars)
        if definitions := view.tools(body):
            attributes[names.ATTR_TOOL_DEFINITIONS] = _bounded_definitions(definitions, self.max_chars,
                                                                           self.redact_keys)
        return attributes

    def answer_attributes(self, view: MessageView, output: Sequence[Mapping[str, Any]],
                          finish_reason: str | None) -> dict[str, str]:
        """What goes on the span of the answer."""
        message = self._safe([output_message(view, output, finish_reason)])
        return {names.ATTR_OUTPUT_MESSAGES: _bounded_json(message, self.max_chars)}
