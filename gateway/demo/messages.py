"""The scripted model's Anthropic Messages API (`POST /v1/messages`), on top of the same policies.

A Messages request is checked as Anthropic checks it (`max_tokens` given, every `tool_use` answered
by a `tool_result` at the start of the next user message, a thinking block's signature unchanged),
then turned into the Chat-shaped view the policies read (`chat_view`); a policy's `Reply` becomes a
message (`build_message`) or its SSE events (`message_events`). A thinking block's signature here is
a digest of its text, so an altered block is refused as the real API refuses it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from gateway.demo.reply import Reply
from gateway.demo.responses import RequestRefused, arguments_text, pieces

_STOP = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn", "content_filter": "refusal"}


# Anthropic's error types by status, as its API names them.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error",
               529: "overloaded_error"}


def error_event(status: int, message: str) -> dict[str, Any]:
    """An error as Anthropic sends it: the body of an error answer, or the event that ends a stream."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessagesRefused(RequestRefused):
    """A request Anthropic refuses with 400; `body()` is its error JSON."""

    status = 400

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "invalid_request_error", "message": str(self)}}


class ThreadNotFound(MessagesRefused):
    """A continued thread the API does not hold: a 404 whose `error_code` Anthropic's SDK reads (it
    then sends the whole conversation again, under a new thread)."""

    status = 404

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "not_found_error", "message": str(self),
                                           "details": {"error_code": "thread_not_found"}}}


THREAD_FIELDS = ("system", "tools")  # what a thread keeps from the request that created it


class Threads:
    """The conversations the scripted API holds for the beta `thread` field, as Anthropic's does:
    `{"type": "create"}` holds the conversation (its messages, then the answer) under the answer's
    id, with the request's system and tools; `{"type": "continue", "previous_message_id": id}`
    sends only the new messages, which follow the conversation held under that id, and no system
    or tools. The last `keep` are held."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._held: dict[str, tuple[list[Any], dict[str, Any]]] = {}

    def whole(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request with the conversation its thread continues put back."""
        thread = body.get("thread")
        if thread is None:
            return body
        if not isinstance(thread, dict) or thread.get("type") not in ("create", "continue"):
            raise MessagesRefused("thread: Input should be a thread object of type create or continue", "thread")
        if thread["type"] == "create":
            return body
        for name in THREAD_FIELDS:
            if name in body:
                raise MessagesRefused(f"{name}: cannot be changed on a thread", name)
        previous = thread.get("previous_message_id")
        held = self._held.get(previous) if isinstance(previous, str) else None
        if held is None:
            raise ThreadNotFound(f"thread: no thread continues from message '{previous}'", "thread")
        messages, fields = held
        return {**body, **fields, "messages": [*messages, *body.get("messages", [])]}

    def answered(self, body: dict[str, Any], whole: dict[str, Any], message: dict[str, Any]) -> None:
        """Hold the conversation of a threaded request (`whole`: as whole() made it) and its answer."""
        if body.get("thread") is None:
            return
        answer = {"role": "assistant", "content": message["content"]}
        self._held[message["id"]] = ([*whole["messages"], answer],
                                     {name: whole[name] for name in THREAD_FIELDS if name in whole})
        while len(self._held) > self.keep:
            del self._held[next(iter(self._held))]


def signature(thinking: str) -> str:
    """The signature the scripted model gives a thinking block (and checks when it comes back)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []


def check_messages(body: dict[str, Any]) -> None:
    """Refuses, as Anthropic does, what a model could not read."""
    if not isinstance(body.get("max_tokens"), int):
        raise MessagesRefused("max_tokens: Field required", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesRefused("messages: at least one message is required", "messages")
    called: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise MessagesRefused(f"messages.{i}: each message needs a role of user or assistant", "messages")
        blocks = _blocks(message)
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        first = [b.get("tool_use_id") for b in blocks[:len(called)] if b.get("type") == "tool_result"]
        if called and (message["role"] != "user" or sorted(map(str, first)) != sorted(called)):
            raise MessagesRefused(f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                                  f"after: {', '.join(called)}. Each `tool_use` block must have a corresponding "
                                  "`tool_result` block in the next message.", "messages")
        if results and not called:
            raise MessagesRefused(f"messages.{i}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: "
                                  f"{results[0]}. Each `tool_result` block must have a corresponding `tool_use` "
                                  "block in the previous message.", "messages")
        for block in blocks:
            if block.get("type") == "thinking" and block.get("signature") != signature(str(block.get("thinking"))):
                raise MessagesRefused(f"messages.{i}.content: Invalid `signature` in `thinking` block", "messages")
        called = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"] if message["role"] == "assistant" \
            else []


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict)) if isinstance(content, list) else ""


def _chat_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Messages message as Chat messages: a user's results become tool messages."""
    blocks = _blocks(message)
    if message["role"] == "assistant":
        calls = [{"id": b.get("id"), "type": "function",
                  "function": {"name": b.get("name"), "arguments": arguments_text(b.get("input", {}))}}
                 for b in blocks if b.get("type") == "tool_use"]
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text") or None
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    out = [{"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _text(b.get("content"))}
           for b in blocks if b.get("type") == "tool_result"]
    text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    return out + ([{"role": "user", "content": text}] if text else [])


def _chat_tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "none": "none"}.get(str(kind), "auto")


def chat_view(body: dict[str, Any], model_name: str) -> dict[str, Any]:
    """The Chat-shaped view of a Messages request that a policy sees."""
    system = _text(body.get("system"))
    view = {key: value for key, value in body.items() if key not in ("messages", "system", "tools", "tool_choice")}
    view["model"] = body.get("model", model_name)
    view["messages"] = [*([{"role": "system", "content": system}] if system else []),
                        *(m for message in body["messages"] for m in _chat_messages(message))]
    view["stream"] = bool(body.get("stream"))
    if isinstance(body.get("tools"), list):
        view["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""), "parameters": t.get("input_schema", {})}}
            for t in body["tools"] if isinstance(t, dict)]
    if "tool_choice" in body:
        view["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    return view


def _input(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # broken JSON, as a test scripts it: streamed as it is


def build_message(body: dict[str, Any], reply: Reply, number: int, model_name: str) -> dict[str, Any]:
    """The message for `reply`; `number` makes its ids (and tool_use ids) unique."""
    content: list[dict[str, Any]] = []
    if reply.reasoning:
        content.append({"type": "thinking", "thinking": reply.reasoning, "signature": signature(reply.reasoning)})
    if reply.content:
        content.append({"type": "text", "text": reply.content})
    content += [{"type": "tool_use", "id": f"toolu_scripted_{number}_{i}", "name": name, "input": _input(arguments)}
                for i, (name, arguments) in enumerate(reply.tool_calls)]
    prompt, completion = reply.usage
    return {"id": f"msg_scripted_{number}", "type": "message", "role": "assistant",
            "model": body.get("model", model_name), "content": content,
            "stop_reason": _STOP.get(reply.finish(), reply.finish()), "stop_sequence": None,
            "usage": {"input_tokens": prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": completion, "service_tier": "standard"}}


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    kind = block["type"]
    if kind == "thinking":
        start = {**block, "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "text":
        start = {**block, "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
    else:
        start = {**block, "input": {}}
        text = block["input"] if isinstance(block["input"], str) else json.dumps(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(text)]
    return [{"type": "content_block_start", "index": index, "content_block": start},
            *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
            {"type": "content_block_stop", "index": index}]


def message_events(message: dict[str, Any]) -> list[bytes]:
    """`message` streamed as Anthropic streams it: message_start, a ping, each block's start, deltas
    and stop, message_delta with the stop reason and the output tokens, message_stop."""
    usage = message["usage"]
    opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": opening}, {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    events += [{"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]}}, {"type": "message_stop"}]
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
