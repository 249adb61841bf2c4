"""The messages of a model turn as a reader wants them: what the turn added to the conversation
(the history a client re-sends every time is on the page already, a turn above), each message as
its role and its parts, and the whole request a click away.

Messages are the store's GenAI shape (`telemetry.messages`): a list of {"role", "parts"}, a part
{"type": "text", "content"}, {"type": "tool_call", "id", "name", "arguments"} or
{"type": "tool_call_response", "id", "response"}; or a string, when the store held text that is
not JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.settings.model import Settings
from gateway.ui.markup import EMPTY, Html, join, render, when

# The setting the page tells a reader to turn on, and its variable (tests/ui/test_messages.py
# checks that setting them does turn capture on).
CAPTURE_SETTING = "capture_message_content"
CAPTURE_VARIABLE = f"{Settings.model_config.get('env_prefix', '')}{CAPTURE_SETTING}".upper()


def _common(sent: Sequence[Any], before: Sequence[Any]) -> int:
    """How many messages `sent` and `before` begin with alike."""
    count = 0
    for mine, theirs in zip(sent, before, strict=False):
        if mine != theirs:
            break
        count += 1
    return count


def _continued(sent: Sequence[Any], before: Sequence[Any]) -> int:
    """Where what `sent` has of `before` (the previous turn's history) ends in `sent`: they begin
    alike (a client re-sends its own history, which lacks the tool rounds the gateway ran for it,
    so it may part from the previous turn's after the question), or, when capture left the oldest
    messages out of `sent`, `sent` begins with a tail of `before`. 0: neither."""
    if common := _common(sent, before):
        return common
    for start in (index for index, message in enumerate(before) if sent and message == sent[0]):
        if (found := _common(sent, before[start:])) == len(before) - start:  # few: a message rarely repeats
            return found
    return 0


def added_messages(sent: Any, before: Any) -> list[Any] | None:
    """The messages of `sent` that the previous turn's (`before`) did not have, less the previous
    answer that comes back as the first of them (the page shows it as that turn's answer); None
    when the turns do not continue one another (no previous turn, another conversation)."""
    if not isinstance(sent, list) or not isinstance(before, list):
        return None
    end = _continued(sent, before)
    if not end:
        return None
    rest = sent[end:]
    if rest and isinstance(rest[0], dict) and rest[0].get("role") == "assistant":
        return rest[1:]
    return rest


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _pretty(value: Any) -> str:
    """A tool's result, indented when it is JSON (as text, the usual case), else as it is."""
    if isinstance(value, str):
        try:
            return json.dumps(json.loads(value), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def _part(part: Any) -> Html:
    if not isinstance(part, dict):
        return render('<pre class="part">{text}</pre>', text=_text(part))
    kind = part.get("type")
    if kind == "text":
        return render('<pre class="part">{text}</pre>', text=_text(part.get("content", "")))
    if kind == "tool_call":
        return render('<div class="part">calls <code>{name}</code> <code>{arguments}</code></div>',
                      name=_text(part.get("name", "?")), arguments=_text(part.get("arguments", {})))
    if kind == "tool_call_response":
        return render('<div class="part">result of <code>{id}</code></div><pre class="part">{text}</pre>',
                      id=_text(part.get("id", "?")), text=_pretty(part.get("response", "")))
    return render('<div class="part muted">({kind} content, not captured)</div>', kind=_text(kind))


def _message(message: Any) -> Html:
    role = message.get("role", "?") if isinstance(message, dict) else "?"
    parts = message.get("parts") if isinstance(message, dict) else [message]
    return render('<li class="message {role}"><span class="role">{role}</span>{parts}</li>', role=_text(role),
                  parts=join(_part(part) for part in parts or []))


def message_list(messages: Any) -> Html:
    if isinstance(messages, str):  # not JSON: as the store has it
        return render('<pre class="messages">{text}</pre>', text=messages)
    return render('<ol class="messages">{items}</ol>', items=join(_message(m) for m in messages or []))


def _whole(messages: Any) -> Html:
    text = messages if isinstance(messages, str) else json.dumps(messages, indent=2, ensure_ascii=False)
    count = f"{len(messages):,} messages" if isinstance(messages, list) else "as stored"
    return render('<details class="whole-request"><summary>the whole request ({count}, JSON)</summary>'
                  '<pre class="messages">{text}</pre></details>', count=count, text=text)


def sent_messages(sent: Any, before: Any) -> Html:
    """A turn's "messages sent": the new ones shown, the whole request collapsed below them."""
    if sent is None:
        return EMPTY
    added = added_messages(sent, before)
    label = ("messages sent" if before is None else "messages sent (all: this turn does not continue the one above)"
             if added is None else "messages sent (new since the previous turn)")
    shown = message_list(sent if added is None else added)
    return render('<div class="label">{label}</div><div class="new-messages">{shown}</div>{whole}', label=label,
                  shown=when(added != [], shown) or render('<p class="muted">nothing new</p>'), whole=_whole(sent))


def answer(messages: Any) -> Html:
    if messages is None:
        return EMPTY
    return render('<div class="label">the model\'s answer</div><div class="answer">{shown}</div>',
                  shown=message_list(messages))


def capture_off() -> Html:
    """Said on a page of model turns none of which has its messages: the store only has them when
    the gateway captured them, and `serve` does not unless told to (the demo does)."""
    return render(
        '<p class="hint capture-off">Messages were not captured for these model turns, so the page shows the '
        'tool calls but not the conversation. The setting <code>{setting}</code> turns capture on: '
        '<code>{variable}=true</code> in the environment, or <code>{setting} = true</code> in the '
        '<code>--config</code> file (<code>toolspan demo</code> has it on). Requests made after that show '
        'their messages here.</p>', setting=CAPTURE_SETTING, variable=CAPTURE_VARIABLE)
