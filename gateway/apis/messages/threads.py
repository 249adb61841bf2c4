"""Anthropic's message threads (the beta `thread` field), held by the gateway.

A client that threads (Anthropic's SDK does in its tool runner, unless told not to) sends the whole
conversation once, with `{"type": "create"}`, and then only what is new, with `{"type": "continue",
"previous_message_id": <the answer it continues>}` and without `system` and `tools`, which the
thread keeps. Passed on, the field would have the provider hold the conversation as the provider
saw it: ending in the gateway's own call of a turn that called both sides, or, for an answer over
several rounds, at its first round, whose call the gateway answered in the rounds after it.

So the gateway holds threads itself, per gateway key, in the state store (memory or Redis): under
the id of each answer, the conversation as the client knows it (what a client that sends the whole
conversation would send) and the thread's system and tools. A continued thread is that
conversation followed by the new messages, planned as any whole conversation is (held turns put
back), and the provider never sees `thread`. One the gateway does not hold (expired, pushed out,
made with another key, too large to keep) is a 404 whose `error_code` is `thread_not_found`, on
which Anthropic's SDK sends the whole conversation again under a new thread.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.apis.messages.render import DETAILED_CODES, message
from gateway.engine import Event, Finished
from gateway.errors import BadRequest, GatewayError, NotFound
from gateway.state import StateStore

log = logging.getLogger("toolspan")
THREAD_NOT_FOUND = "thread_not_found"  # the error_code Anthropic's SDK recovers from
assert THREAD_NOT_FOUND in DETAILED_CODES  # said in the error's details, where the SDK reads it
KEPT_FIELDS = ("system", "tools")  # what a thread keeps from the request that created it
MAX_ID_CHARS = 256  # of a previous_message_id: message ids are a few dozen characters


def thread_not_found(message_id: str) -> NotFound:
    """What a key hears of a thread it cannot continue: one not held, and another key's, alike."""
    return NotFound(f"thread: no thread continues from message '{message_id}'", param="thread",
                    code=THREAD_NOT_FOUND)


def continued(body: Mapping[str, Any]) -> str | None:
    """The id of the answer a request's thread continues from; None for a request that starts a
    thread, or has none. A `thread` of another shape is a 400."""
    thread = body.get("thread")
    if thread is None:
        return None
    kind = thread.get("type") if isinstance(thread, dict) else None
    if kind == "create":
        return None
    previous = thread.get("previous_message_id") if kind == "continue" else None
    if not isinstance(previous, str) or not 0 < len(previous) <= MAX_ID_CHARS:
        raise BadRequest('thread must be {"type": "create"} or {"type": "continue", "previous_message_id": '
                         f'"<an id of at most {MAX_ID_CHARS} characters>"}}', param="thread")
    return previous


@dataclass(frozen=True)
class ThreadRecord:
    """A thread's conversation as its client knows it, and the fields it keeps (system, tools)."""

    messages: tuple[Any, ...]
    fields: Mapping[str, Any]

    def dump(self) -> str:
        return json.dumps({"messages": self.messages, "fields": self.fields}, separators=(",", ":"))

    @staticmethod
    def load(text: str) -> ThreadRecord | None:
        """The record `dump` wrote; None for anything else (a store's garbage is missing)."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return None
        messages, fields = (data.get("messages"), data.get("fields")) if isinstance(data, dict) else (None, None)
        if not isinstance(messages, list) or not isinstance(fields, dict) or not set(fields) <= set(KEPT_FIELDS):
            return None
        return ThreadRecord(tuple(messages), fields)


async def whole(body: dict[str, Any], state: StateStore, principal: str | None) -> dict[str, Any]:
    """The request with the conversation its thread continues put back before its new messages,
    and the thread's system and tools (which a continued thread may not send again: a 400)."""
    previous = continued(body)
    if previous is None:
        return body
    for name in KEPT_FIELDS:
        if name in body:
            raise BadRequest(f"{name}: a continued thread keeps the {name} it was created with; to change it, "
                             "start a new thread", param=name)
    text = (await state.threads.get(principal, [previous])).get(previous)
    record = ThreadRecord.load(text) if text is not None else None
    if record is None:
        raise thread_not_found(previous)
    sent = body.get("messages")
    if not isinstance(sent, list):
        return body  # the request's check says what is wrong with it
    return {**body, **record.fields, "messages": [*record.messages, *sent]}


async def kept(events: AsyncGenerator[Event, None], state: StateStore, principal: str | None,
               body: Mapping[str, Any], max_bytes: int) -> AsyncGenerator[Event, None]:
    """`events`, and before the answer of a threaded request reaches its client (who may continue
    from it at once), its thread kept under the answer's id: `body`'s conversation (whole), then
    the answer as the client gets it."""
    async with aclosing(events) as running:
        async for event in running:
            if isinstance(event, Finished):
                await _keep(state, principal, body, event, max_bytes)
            yield event


async def _keep(state: StateStore, principal: str | None, body: Mapping[str, Any], finished: Finished,
                max_bytes: int) -> None:
    answer = message(finished)
    answer_id = answer.get("id")
    if not isinstance(answer_id, str):
        return  # an answer without an id names nothing a thread could continue from
    conversation = (*body["messages"], {"role": "assistant", "content": answer["content"]})
    text = ThreadRecord(conversation, {name: body[name] for name in KEPT_FIELDS if name in body}).dump()
    # Not kept, the thread's next turn hears thread_not_found and is sent whole: the answer matters more.
    if len(text) > max_bytes:
        log.info("a thread's conversation is larger than answer_record_max_bytes (%d bytes): not kept", len(text))
        return
    try:
        await state.threads.put(principal, {answer_id: text})
    except GatewayError:  # Redis down
        log.warning("a thread's conversation could not be kept: its next turn will be sent whole")
