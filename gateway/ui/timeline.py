"""One trajectory's timeline, from `telemetry.store.report.trajectory`'s shape: a page of its requests,
each with its model turns and tool calls in the order they started. A failed call shows the
arguments the model sent and the diagnostic it got back, and links to the call that retried it
(and back), on whichever page that call is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gateway.tools.approval_text import decision_text
from gateway.ui.diff import arguments_diff
from gateway.ui.layout import escape_all, ms, notice, plural, tag, trace_link, when_at
from gateway.ui.markup import EMPTY, Html, join, render, when
from gateway.ui.messages import answer, capture_off, sent_messages
from telemetry.store.rows import guardrail_decisions, guardrail_words, repair_words

FAILED = frozenset({"error", "rejected", "timeout", "cancelled"})
# Requests a page shows unless its address asks (?limit=) for another number, and the most it may
# ask for: a page is rendered whole before any of it is sent.
PAGE_REQUESTS, MOST_PAGE_REQUESTS = 200, 1000


def _anchor(span_id: str) -> str:
    return f"call-{span_id}"


@dataclass(frozen=True)
class Paging:
    """The page of a trajectory's requests shown (from 1) and how many a page holds."""

    trajectory_id: str  # as the store keys it
    page: int
    limit: int = PAGE_REQUESTS

    def page_of(self, index: int) -> int:
        """The page that shows the request at `index` (from 1)."""
        return (index - 1) // self.limit + 1

    def href(self, page: int, anchor: str = "") -> str:
        query = [f"page={page}"] if page > 1 else []
        query += [f"limit={self.limit}"] if self.limit != PAGE_REQUESTS else []
        address = f"/ui/trajectories/{quote(self.trajectory_id, safe='')}"
        return address + (f"?{'&'.join(query)}" if query else "") + (f"#{anchor}" if anchor else "")

    def call_href(self, span_id: str, request_index: int) -> str:
        """Where a call is: its anchor on this page, or on the page of its request."""
        page = self.page_of(request_index)
        return f"#{_anchor(span_id)}" if page == self.page else self.href(page, _anchor(span_id))


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


def _retry(call: Mapping[str, Any], paging: Paging, sent: Mapping[str, str]) -> Html:
    """Which failed call this one retries, and what it changed (when both calls' arguments are on
    the page: `sent`, by span id); which call retried this one."""
    lines = []
    retried, retried_in = call.get("retries_span_id"), call.get("retries_request")
    if call.get("retry_kind"):
        target = (render('<a href="{href}">the failed call</a>', href=paging.call_href(retried, retried_in))
                  if retried and retried_in else render("a failed call no longer stored"))
        lines.append(render('<div class="retry">{kind} retry of {target}</div>',
                            kind=tag(call["retry_kind"]), target=target))
        failed, corrected = sent.get(retried or ""), call.get("arguments")
        if call["retry_kind"] == "corrected" and failed is not None and corrected is not None:
            lines.append(arguments_diff(failed, str(corrected)))
    by = call.get("retried_by")
    if by and by.get("request"):
        lines.append(render('<div class="retry">retried by <a href="{href}">the next call</a></div>',
                            href=paging.call_href(by["span_id"], by["request"])))
    return join(lines)


def _decided(call: Mapping[str, Any]) -> Html:
    """What became of the call's approval, when it waited for a reviewer's."""
    said = decision_text(call)
    return when(said, render('<div class="decision" data-decision="{d}">{said}</div>', d=call.get("decision"),
                             said=said))


def _guarded(call: Mapping[str, Any]) -> Html:
    """What guardrails decided on the call, next to it: each decision but an allow in words, and the
    guardrails that only allowed it in one line."""
    decisions = guardrail_decisions(dict(call))
    said = [render('<div class="guardrail" data-decision="{d}">{words}</div>', d=d.get("decision"),
                   words=guardrail_words(d)) for d in decisions if d.get("decision") != "allow"]
    acted = {d.get("guardrail") for d in decisions if d.get("decision") != "allow"}
    allowed = list(dict.fromkeys(str(d.get("guardrail")) for d in decisions if d.get("guardrail") not in acted))
    if allowed:
        said.append(render('<div class="guardrail muted" data-decision="allow">{which} {names} allowed it</div>',
                           which="guardrail" if len(allowed) == 1 else "guardrails", names=", ".join(allowed)))
    return join(said)


def _aliased(call: Mapping[str, Any]) -> Html:
    """The parameter aliases the call's arguments used, each beside the parameter it stands for."""
    aliases = call.get("aliases") or {}
    pairs = [render("<code>{alias}</code> → <code>{name}</code>", alias=alias, name=name)
             for alias, name in aliases.items()]
    return when(pairs, render('<div class="aliases">aliases used: {pairs}</div>', pairs=join(pairs, ", ")))


def _repaired(call: Mapping[str, Any]) -> Html:
    """What argument repair found for the call: its mode and changes, and the arguments before and
    after (in mode observe the call stayed rejected, and ran on neither)."""
    said = repair_words(dict(call))
    if said is None:
        return EMPTY
    before, after = call.get("repair_before"), call.get("repair_after")
    return render('<div class="repair" data-mode="{mode}">{said}</div>{before}{after}', mode=call.get("repair_mode"),
                  said=said, before=when(before is not None, _block("arguments before repair", _pretty(str(before)),
                                                                    "arguments repair-before")),
                  after=when(after is not None, _block("arguments after repair", _pretty(str(after)),
                                                       "arguments repair-after")))


def _tool_call(call: Mapping[str, Any], paging: Paging, sent: Mapping[str, str]) -> Html:
    outcome = call.get("outcome") or "unknown"
    failed = outcome in FAILED
    reason = call.get("rejection_reason") or call.get("error_type")
    details = []
    if call.get("arguments") is not None:
        details.append(_block("arguments the model sent", _pretty(str(call["arguments"])), "arguments"))
    if call.get("diagnostic"):
        details.append(_block("what the model was told", str(call["diagnostic"]), "diagnostic"))
    client = call.get("side") == "client"  # the client's own tool: the gateway checked the call, the client ran it
    return render(
        '<li id="{anchor}" class="call {state}{side}" data-side="{whose}"><div><strong>{kind}</strong> '
        '<code>{tool}</code> '
        '{outcome}{reason} <span class="muted">round {round} · {duration}{server}{result}</span></div>'
        '{decided}{guarded}{aliased}{repaired}{names}{retry}{details}</li>',
        anchor=_anchor(call["span_id"]), state="failed" if failed else outcome, tool=call["tool"],
        side=" client" if client else "", whose="client" if client else "gateway",
        kind="client tool call" if client else "tool call",
        outcome=tag(outcome), reason=when(reason, render(" <span class=\"reason\">({r})</span>", r=reason)),
        round=call.get("round") if call.get("round") is not None else "-", duration=ms(call.get("duration_ms")),
        server=when(call.get("mcp_server"), render(" · MCP server {s}", s=call.get("mcp_server"))),
        result=when(call.get("client_ms") is not None, render(
            " · result {o}, {b} bytes, {t} on the client's side", o=call.get("result_outcome"),
            b=call.get("result_bytes"), t=ms(call.get("client_ms")))),
        decided=_decided(call), guarded=_guarded(call), aliased=_aliased(call), repaired=_repaired(call),
        names=_names(call), retry=_retry(call, paging, sent),
        details=join(details))


def _upstream(turn: Mapping[str, Any]) -> Html:
    """Where a model turn went, when the store says: its upstream, and the one it fell back from."""
    fell_back = when(turn.get("fallback_from"), render(" (fell back from {f})", f=turn.get("fallback_from")))
    return when(turn.get("upstream"), render(" · upstream {u}{f}", u=turn.get("upstream"), f=fell_back))


def _model_turn(turn: Mapping[str, Any], before: Any) -> Html:
    """A model turn; `before`, the messages the turn before it sent (None for the first shown)."""
    tokens = f"tokens in/out {turn.get('input_tokens') or 0}/{turn.get('output_tokens') or 0}"
    finish = ", ".join(turn.get("finish_reasons") or ()) or "-"
    error = turn.get("error_message") or turn.get("error_type")
    return render(
        '<li class="turn"><div><strong>model turn</strong> <code>{model}</code> '
        '<span class="muted">round {round} · finish {finish} · {tokens} · {duration}{upstream}</span></div>{error}'
        '{input}{output}</li>',
        model=turn.get("response_model") or turn.get("model") or "?", round=turn.get("round") or "-", finish=finish,
        tokens=tokens, duration=ms(turn.get("duration_ms")), upstream=_upstream(turn),
        error=when(error, _block("provider error", str(error), "diagnostic")),
        input=sent_messages(turn.get("input_messages"), before), output=answer(turn.get("output_messages")))


@dataclass(frozen=True)
class _Shown:
    """What the page's events are drawn with: its paging, and what one event needs of another."""

    paging: Paging
    trace_ui: str | None
    arguments: Mapping[str, str]  # each tool call's arguments, by span id, where the store has them
    before: Mapping[str, Any]  # each model turn's previous turn's messages sent, by span id

    @classmethod
    def of(cls, requests: list[Mapping[str, Any]], paging: Paging, trace_ui: str | None) -> _Shown:
        arguments: dict[str, str] = {}
        before: dict[str, Any] = {}
        previous = None
        for event in (event for request in requests for event in request["events"]):
            if event["type"] == "model_turn":
                before[event["span_id"]], previous = previous, event.get("input_messages")
            elif event.get("arguments") is not None:
                arguments[event["span_id"]] = str(event["arguments"])
        return cls(paging, trace_ui, arguments, before)


def _event(event: Mapping[str, Any], shown: _Shown) -> Html:
    if event["type"] == "model_turn":
        return _model_turn(event, shown.before.get(event["span_id"]))
    return _tool_call(event, shown.paging, shown.arguments)


def _request(request: Mapping[str, Any], shown: _Shown) -> Html:
    events = [_event(e, shown) for e in request["events"]]
    trace_ui = shown.trace_ui
    return render(
        '<section class="card request"><h2>Request {n}: {name}</h2><p class="muted">{started} · status {status}'
        ' · {rounds} · {duration}{limit} · trace {trace}</p><ol class="timeline">{events}</ol></section>',
        n=f"{request['index']:,}", name=request.get("name") or request.get("route") or "request",
        started=when_at(request["started"]), status=request.get("status") or "-",
        rounds=plural(request.get("rounds") or 0, "round"), duration=ms(request["duration_ms"]),
        limit=when(request.get("limit_reached"), render(" · round limit reached")),
        trace=trace_link(request.get("trace_id"), trace_ui) or "-", events=join(events))


def pages(total: int, limit: int) -> int:
    """How many pages `total` requests fill, `limit` a page (one, when there are none)."""
    return max(1, -(-total // limit))


def _pager(trajectory: Mapping[str, Any], paging: Paging) -> Html:
    """Which requests the page shows, of how many, and the links to the other pages."""
    shown, total = trajectory["requests"], trajectory["totals"]["requests"]
    last = pages(total, paging.limit)
    if last == 1:
        return EMPTY
    before, after = paging.page - 1, paging.page + 1
    wanted = [(1, "first", "first page", before > 1), (before, "prev", "← previous", before >= 1),
              (after, "next", "next →", after <= last), (last, "last", "last page", after < last)]
    links = [render('<a href="{href}" rel="{rel}">{label}</a>', href=paging.href(page), rel=rel, label=label)
             for page, rel, label, shown_here in wanted if shown_here]
    return render('<nav class="pages"><p>Showing requests {first}-{end} of {total} (page {page} of {last}) · '
                  '{links} <span class="muted">· ?limit=N shows up to {most} a page</span></p></nav>',
                  first=f"{shown[0]['index']:,}", end=f"{shown[-1]['index']:,}", total=f"{total:,}",
                  page=f"{paging.page:,}", last=f"{last:,}", links=join(links, " · "), most=f"{MOST_PAGE_REQUESTS:,}")


def timeline_page(trajectory: Mapping[str, Any], paging: Paging, trace_ui: str | None) -> Html:
    """The page `paging` names of the trajectory's requests (`trajectory` holds them)."""
    requests, totals = trajectory["requests"], trajectory["totals"]
    if not requests:
        return notice("This trajectory has no request recorded.")
    summary = render('<p class="muted">{key}{started} to {ended} · {requests} · {calls}, {failed} failed · '
                     '<a href="/ui/trajectories">all trajectories</a></p>',
                     key=when(trajectory.get("key"), render("gateway key {k} · ", k=trajectory.get("key"))),
                     started=when_at(trajectory["started"]), ended=when_at(trajectory["ended"]),
                     requests=plural(totals["requests"], "request"), calls=plural(totals["tool_calls"], "tool call"),
                     failed=f"{totals['failed_calls']:,}")
    pager = _pager(trajectory, paging)
    shown = _Shown.of(requests, paging, trace_ui)
    turns = [event for request in requests for event in request["events"] if event["type"] == "model_turn"]
    uncaptured = turns and all(turn.get("input_messages") is None for turn in turns)
    return render("{summary}{uncaptured}{pager}{requests}{pager}", summary=summary, pager=pager,
                  uncaptured=when(uncaptured, capture_off()), requests=join(_request(r, shown) for r in requests))
