"""One trajectory's timeline, from `telemetry.report.trajectory`'s shape: each request, its model
turns and tool calls in the order they started. A failed call shows the arguments the model sent
and the diagnostic it got back, and links to the call that retried it (and back)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.routes.ui_layout import escape_all, ms, notice, plural, tag, trace_link, when_at
from gateway.routes.ui_markup import EMPTY, Html, join, render, when

FAILED = frozenset({"error", "rejected", "timeout", "cancelled"})


def _anchor(span_id: str) -> str:
    return f"call-{span_id}"


def _pretty(text: str) -> str:
    """Arguments as the model sent them, indented when they are JSON (they may not be)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return text


def _block(label: str, text: str, cls: str) -> Html:
    return render('<div class="label">{label}</div><pre class="{cls}">{text}</pre>', label=label, text=text, cls=cls)


def _names(call: Mapping[str, Any]) -> Html:
    parts = []
    if call.get("missing"):
        parts.append(render("missing {names}", names=escape_all(call["missing"])))
    suggestions = call.get("suggestions") or {}
    for sent in call.get("unrecognized") or ():
        accepted = suggestions.get(sent)
        parts.append(render("sent <code>{sent}</code>{hint}", sent=sent,
                            hint=render(" → <code>{a}</code>", a=accepted) if accepted else EMPTY))
    return when(parts, render('<div class="names">{parts}</div>', parts=join(parts, "; ")))


def _retry(call: Mapping[str, Any], on_page: set[str], retried_by: Mapping[str, str]) -> Html:
    lines = []
    retried = call.get("retries_span_id")
    if call.get("retry_kind"):
        target = (render('<a href="#{a}">the failed call</a>', a=_anchor(retried)) if retried in on_page
                  else render("a failed call no longer stored"))
        lines.append(render('<div class="retry">{kind} retry of {target}</div>',
                            kind=tag(call["retry_kind"]), target=target))
    if call["span_id"] in retried_by:
        lines.append(render('<div class="retry">retried by <a href="#{a}">the next call</a></div>',
                            a=_anchor(retried_by[call["span_id"]])))
    return join(lines)


def _tool_call(call: Mapping[str, Any], on_page: set[str], retried_by: Mapping[str, str]) -> Html:
    outcome = call.get("outcome") or "unknown"
    failed = outcome in FAILED
    reason = call.get("rejection_reason") or call.get("error_type")
    details = []
    if call.get("arguments") is not None:
        details.append(_block("arguments the model sent", _pretty(str(call["arguments"])), "arguments"))
    if call.get("diagnostic"):
        details.append(_block("what the model was told", str(call["diagnostic"]), "diagnostic"))
    return render(
        '<li id="{anchor}" class="call {state}"><div><strong>tool call</strong> <code>{tool}</code> '
        '{outcome}{reason} <span class="muted">round {round} · {duration}{server}</span></div>'
        '{names}{retry}{details}</li>',
        anchor=_anchor(call["span_id"]), state="failed" if failed else outcome, tool=call["tool"],
        outcome=tag(outcome), reason=when(reason, render(" <span class=\"reason\">({r})</span>", r=reason)),
        round=call.get("round") if call.get("round") is not None else "-", duration=ms(call.get("duration_ms")),
        server=when(call.get("mcp_server"), render(" · MCP server {s}", s=call.get("mcp_server"))),
        names=_names(call), retry=_retry(call, on_page, retried_by), details=join(details))


def _messages(label: str, messages: Any) -> Html:
    if messages is None:
        return EMPTY
    text = messages if isinstance(messages, str) else json.dumps(messages, indent=2, ensure_ascii=False)
    return render('<details><summary>{label}</summary><pre class="messages">{text}</pre></details>',
                  label=label, text=text)


def _model_turn(turn: Mapping[str, Any]) -> Html:
    tokens = f"tokens in/out {turn.get('input_tokens') or 0}/{turn.get('output_tokens') or 0}"
    finish = ", ".join(turn.get("finish_reasons") or ()) or "-"
    error = turn.get("error_message") or turn.get("error_type")
    return render(
        '<li class="turn"><div><strong>model turn</strong> <code>{model}</code> '
        '<span class="muted">round {round} · finish {finish} · {tokens} · {duration}</span></div>{error}'
        '{input}{output}</li>',
        model=turn.get("response_model") or turn.get("model") or "?", round=turn.get("round") or "-", finish=finish,
        tokens=tokens, duration=ms(turn.get("duration_ms")),
        error=when(error, _block("provider error", str(error), "diagnostic")),
        input=_messages("messages sent", turn.get("input_messages")),
        output=_messages("the model's answer", turn.get("output_messages")))


def _request(index: int, request: Mapping[str, Any], on_page: set[str], retried_by: Mapping[str, str],
             trace_ui: str | None) -> Html:
    events = [_model_turn(e) if e["type"] == "model_turn" else _tool_call(e, on_page, retried_by)
              for e in request["events"]]
    return render(
        '<section class="card request"><h2>Request {n}: {name}</h2><p class="muted">{started} · status {status}'
        ' · {rounds} · {duration}{limit} · trace {trace}</p><ol class="timeline">{events}</ol></section>',
        n=index, name=request.get("name") or request.get("route") or "request", started=when_at(request["started"]),
        status=request.get("status") or "-", rounds=plural(request.get("rounds") or 0, "round"),
        duration=ms(request["duration_ms"]),
        limit=when(request.get("limit_reached"), render(" · round limit reached")),
        trace=trace_link(request.get("trace_id"), trace_ui) or "-", events=join(events))


def _retried_by(requests: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The failed call each retry answers, turned around: failed call -> the call that retried it."""
    links: dict[str, str] = {}
    for request in requests:
        for event in request["events"]:
            if event["type"] == "tool_call" and event.get("retries_span_id"):
                links.setdefault(str(event["retries_span_id"]), str(event["span_id"]))
    return links


def timeline_page(trajectory: Mapping[str, Any], trace_ui: str | None) -> Html:
    requests = trajectory["requests"]
    if not requests:
        return notice("This trajectory has no request recorded.")
    on_page = {str(e["span_id"]) for r in requests for e in r["events"] if e["type"] == "tool_call"}
    retried_by = _retried_by(requests)
    calls = [e for r in requests for e in r["events"] if e["type"] == "tool_call"]
    failed = sum(e.get("outcome") in FAILED for e in calls)
    summary = render('<p class="muted">{key}{started} to {ended} · {requests} · {calls}, {failed} failed · '
                     '<a href="/ui/trajectories">all trajectories</a></p>',
                     key=when(trajectory.get("key"), render("gateway key {k} · ", k=trajectory.get("key"))),
                     started=when_at(trajectory["started"]), ended=when_at(trajectory["ended"]),
                     requests=plural(len(requests), "request"), calls=plural(len(calls), "tool call"), failed=failed)
    return render("{summary}{requests}", summary=summary, requests=join(
        _request(i, r, on_page, retried_by, trace_ui) for i, r in enumerate(requests, 1)))
