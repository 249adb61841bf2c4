"""The report's answers as terminal text: the timeline `toolspan demo` and `toolspan trajectories
show` both print, the list and the report tables. Input: the dicts of `telemetry.store.report`.

Every stored string is what a model, a caller or a provider chose: before it is laid out, each has
its control characters made visible (`gateway.wire.escaping`), so that no value can move the cursor,
clear the screen, retitle the terminal or start a line of its own. The texts that are several
lines by nature (what the model was told, message content) keep their line breaks, and the
layout indents them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from gateway.tools.approval_text import decision_text
from gateway.wire.escaping import visible, visible_lines
from telemetry.store.rows import guardrail_decisions, guardrail_words

# Fields whose line breaks are the text's (an alias's TOML lines: its names are escaped inside it).
_SEVERAL_LINES = frozenset({"diagnostic", "content", "response", "toml"})


def terminal_safe(value: Any, lines: bool = False) -> Any:
    """`value` (a report shape) with every string in it made safe to print; `lines`: a string
    keeps its line breaks."""
    if isinstance(value, str):
        return visible_lines(value) if lines else visible(value)
    if isinstance(value, dict):
        return {visible(str(k)): terminal_safe(v, k in _SEVERAL_LINES) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [terminal_safe(item) for item in value]
    return value


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.0f}%"


def _quoted(lines: str | None, prefix: str = "      | ") -> list[str]:
    return [prefix + line for line in (lines or "").splitlines()]


def _part(part: Any) -> str:
    """One part of a GenAI message as a line: text, a tool call, a tool's answer, or its type."""
    if not isinstance(part, dict):
        return json.dumps(part, ensure_ascii=False)
    kind = part.get("type")
    if kind == "text":
        return str(part.get("content", ""))
    if kind == "tool_call":
        arguments = part.get("arguments")
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return f"calls {part.get('name')}({shown})"
    if kind == "tool_call_response":
        return f"result: {part.get('response', '')}"
    return f"[{kind}]"


def _message_lines(messages: Any, indent: str = "    ") -> list[str]:
    """GenAI messages ({"role", "parts"}), one line a part; text as it came (an importer's)."""
    if isinstance(messages, str):
        return [f"{indent}{messages}"]
    lines = []
    for message in messages if isinstance(messages, list) else []:
        role = message.get("role", "?") if isinstance(message, dict) else "?"
        parts = message.get("parts", []) if isinstance(message, dict) else [message]
        for part in parts or [{"type": "text", "content": ""}]:
            text = _part(part).replace("\n", f"\n{indent}  ")
            lines.append(f"{indent}{role}: {text}")
    return lines


def _new_messages(sent: Any, before: list[Any]) -> Any:
    """The messages of a turn not already shown in its request: the history sent the previous
    time and the answer it got (which comes back as the first message after it)."""
    if not isinstance(sent, list) or not before or sent[:len(before)] != before:
        return sent
    rest = sent[len(before):]
    return rest[1:] if rest and isinstance(rest[0], dict) and rest[0].get("role") == "assistant" else rest


def _model_turn(event: dict[str, Any], before: list[Any]) -> list[str]:
    reasons = ",".join(event["finish_reasons"] or ())
    line = (f"model turn  chat {event['model']}: finish={reasons} tokens in/out="
            f"{event['input_tokens']}/{event['output_tokens']} ({event['duration_ms']:.1f} ms)")
    if event.get("upstream"):
        line += f" upstream={event['upstream']}"
    if event.get("fallback_from"):
        line += f" (fell back from {event['fallback_from']})"
    if event["error_type"]:
        line += f" failed: {event['error_type']}"
    lines = [line]
    if event["input_messages"] is not None:
        lines += _message_lines(_new_messages(event["input_messages"], before))
    if event["output_messages"] is not None:
        lines += ["    answer:", *_message_lines(event["output_messages"], "      ")]
    return lines


def _tool_call(event: dict[str, Any]) -> list[str]:
    reason, server, method = event["rejection_reason"], event["mcp_server"], event["mcp_method"]
    whose = "client tool call" if event.get("side") == "client" else "tool call"
    line = (f"  {whose} {event['tool']}: {event['outcome']}{f' ({reason})' if reason else ''}"
            f" ({event['duration_ms']:.2f} ms){f' [MCP server {server!r}, {method}]' if server else ''}")
    if event["retry_kind"]:
        line += f" [{event['retry_kind']} retry of span {event['retries_span_id']}]"
    if event.get("client_ms") is not None:  # the client ran it: from the answer to the result it sent back
        line += (f" [result {event['result_outcome']}, {event['result_bytes']} bytes,"
                 f" {event['client_ms'] / 1000:.2f} s on the client's side]")
    if (decided := decision_text(event)) is not None:  # it waited for a reviewer's approval
        line += f" [{decided}]"
    lines = [line, *(f"      {guardrail_words(d)}" for d in guardrail_decisions(event) if d.get("decision") != "allow"),
             *_quoted(event["diagnostic"])]
    if event["arguments"] is not None and event["outcome"] != "ok":
        lines.append(f"      arguments sent: {event['arguments']}")
    return lines


def timeline(trajectory: dict[str, Any], events_only: bool = False) -> list[str]:
    """One trajectory, event by event: each model turn, and under it the tool calls it made with
    their outcome, the diagnostic the model got and the retry they are. `events_only` leaves out
    the header lines of the trajectory and its requests (the demo prints its own)."""
    trajectory = terminal_safe(trajectory)
    key = f"  gateway key {trajectory['key']}" if trajectory.get("key") else ""
    lines = [] if events_only else [f"trajectory {trajectory.get('local_id') or trajectory['id']}{key}  "
                                    f"started {_when(trajectory['started'])}", *shown_requests(trajectory)]
    for request in trajectory["requests"]:
        if not events_only:
            lines.append(f"\nrequest {request['name']} -> {request['status']}  rounds: {request['rounds']}  "
                         f"trace id: {request['trace_id']}")
        before: list[Any] = []  # the history of the request's last turn, already shown
        for event in request["events"]:
            if event["type"] != "model_turn":
                lines += _tool_call(event)
                continue
            lines += _model_turn(event, before)
            sent = event["input_messages"]
            before = sent if isinstance(sent, list) else []
    return lines


def shown_requests(trajectory: dict[str, Any]) -> list[str]:
    """"showing requests 201-400 of 2,000" when the trajectory's requests are not all here (a page
    of them); else nothing."""
    shown, total = trajectory["requests"], trajectory.get("totals", {}).get("requests", len(trajectory["requests"]))
    if not shown or len(shown) == total:
        return []
    return [f"showing requests {shown[0]['index']:,}-{shown[-1]['index']:,} of {total:,}"]


def trajectory_list(items: Iterable[dict[str, Any]]) -> list[str]:
    """One line a trajectory; with a column for the gateway key when any trajectory has one (then
    `show --key KEY ID` finds it, as does `show KEY~ID`)."""
    items = [terminal_safe(item) for item in items]
    width = max((len(item["key"]) for item in items if item.get("key")), default=0)
    keys = f"{'key':{width}}  " if width else ""
    lines = [f"{'last active':19}  {keys}{'trajectory':32}  req turns calls failed retries  models / tools"]
    for item in items:
        flag = "  STUCK (verbatim retries)" if item["stuck"] else ""
        key = f"{item.get('key') or '-':{width}}  " if width else ""
        shown = item.get("local_id") or item["id"]
        lines.append(f"{_when(item['ended'])}  {key}{shown[:32]:32}  {item['requests']:3} {item['model_turns']:5} "
                     f"{item['tool_calls']:5} {item['failed_calls']:6} {item['retries']:7}  "
                     f"{','.join(item['models'])} / {','.join(item['tools'])}{flag}")
    return lines


def _figures(name: str, f: dict[str, Any]) -> list[str]:
    retries, recover = f["retries"], f["rounds_to_recover"]
    reasons = ", ".join(f"{r} {v['count']} ({_percent(v['rate'])})" for r, v in f["rejections_by_reason"].items())
    lines = [f"{name}: {f['calls']} calls, {f['rejections']} rejected ({_percent(f['rejection_rate'])})"
             f"{f': {reasons}' if reasons else ''}",
             f"    retries: {retries['verbatim']} verbatim ({_percent(retries['verbatim_rate'])} of failed calls), "
             f"{retries['corrected']} corrected ({_percent(retries['corrected_rate'])})",
             f"    recovered: {f['recoveries']} of {f['failures']} failures ({_percent(f['recovery_rate'])})"
             + (f", in {recover['mean']:.1f} rounds on average (at most {recover['max']})" if recover else "")]
    for rename in f["renames"]:
        lines.append(f"    invented argument {rename['from']!r} -> {rename['to'] or '(no close name)'!s}"
                     f" x{rename['count']}")
    if f["stuck_trajectories"]:
        lines.append(f"    stuck in verbatim retries: {', '.join(f['stuck_trajectories'])}")
    return lines


def report(figures: dict[str, Any]) -> list[str]:
    figures = terminal_safe(figures)
    lines = [f"{figures['trajectories']} trajectories, {figures['model_turns']} model turns, "
             f"{figures['tool_calls']} tool calls, tokens in/out {figures['input_tokens']}/{figures['output_tokens']}",
             "", "per tool:"]
    for item in figures["tools"]:
        lines += ["  " + line for line in _figures(f"{item['tool']} (client tool)" if item.get("side") == "client"
                                                   else item["tool"], item)]
    lines += ["", "per model:"]
    for item in figures["models"]:
        lines += ["  " + line for line in _figures(item["model"], item)]
    if figures["stuck"]:
        lines += ["", "stuck in verbatim retries:"]
        lines += [f"  {s['trajectory_id']}  {s['tool']} re-sent {s['verbatim_retries']} times"
                  for s in figures["stuck"]]
    return lines + _renames(figures) + _guardrails(figures.get("guardrails") or {})


def _guardrails(guardrails: dict[str, Any]) -> list[str]:
    """The guardrails' decisions by guardrail, and the calls they stopped (none: no lines)."""
    if not guardrails.get("decisions"):
        return []
    by_guardrail: dict[str, list[str]] = {}
    for item in guardrails["decisions"]:
        by_guardrail.setdefault(item["guardrail"], []).append(f"{item['decision']} {item['count']}")
    failures = guardrails.get("failures") or {}
    lines = ["", "guardrail decisions:"]
    lines += [f"  {name}: {', '.join(counts)}" + (f" (failed {failures[name]} times)" if name in failures else "")
              for name, counts in by_guardrail.items()]
    if guardrails["stopped_calls"]:
        lines += ["", f"calls a guardrail stopped: {guardrails['stopped_calls']}"
                      + (f" (the newest {len(guardrails['stopped'])})"
                         if guardrails["stopped_calls"] > len(guardrails["stopped"]) else "")]
        lines += [f"  {_when(c['started'])}  {c.get('local_id') or c['id']}  {c['tool']}: {guardrail_words(c)}"
                  for c in guardrails["stopped"]]
    return lines


def _renames(figures: dict[str, Any]) -> list[str]:
    """The renames per tool and model, whether their calls recovered, and the alias lines they
    suggest (none: no lines). `figures` is terminal-safe already."""
    if not figures.get("renames"):
        return []
    lines = ["", "renamed arguments (per tool and model; recovered: a later call of the tool was ok):"]
    lines += [f"  {r['tool']}  {r['model'] or '(no model)'}: {r['from']!r} -> {r['to'] or '(no close name)'}"
              f" x{r['count']}, recovered {r['recovered']} of {r['count']}" for r in figures["renames"]]
    if figures.get("aliases"):
        lines += ["", "aliases to add to the settings (the gateway then takes these names):"]
        lines += ["  " + line for alias in figures["aliases"] for line in alias["toml"].splitlines()]
    return lines


def share(rate: dict[str, Any], of: str = "") -> str:
    """A rate with its counts: "33% (2 of 6, small sample)"; `of` names what was counted."""
    small = ", small sample" if rate["small_sample"] and rate["of"] else ""
    return f"{_percent(rate['rate'])} ({rate['count']} of {rate['of']}{f' {of}' if of else ''}{small})"


_NO_GROUP = {"model": "(no model)", "upstream": "(no upstream)", "key": "(no key)", "tool": "(no tool)"}


def _group(by: str, group: dict[str, Any]) -> list[str]:
    rounds, recover = group["rounds_per_request"], group["rounds_to_recover"]
    reasons = ", ".join(f"{reason} {_percent(r['rate'])} ({r['count']})"
                        for reason, r in group["rejections_by_reason"].items())
    mean = "-" if rounds["mean"] is None else f"{rounds['mean']:.2f}"
    small = ", small sample" if rounds["small_sample"] and rounds["requests"] else ""
    return [f"{group[by] or _NO_GROUP[by]}: {group['calls']} calls, {group['requests']} requests",
            f"    rejected: {share(group['rejections'], 'calls')}{f': {reasons}' if reasons else ''}",
            f"    recovered: {share(group['recoveries'], 'failures')}"
            + (f", in {recover['mean']:.1f} rounds on average (at most {recover['max']})" if recover else ""),
            f"    verbatim retries: {share(group['verbatim_retries'], 'failed calls')}; "
            f"corrected: {share(group['corrected_retries'])}",
            f"    rounds per request: {mean} ({rounds['rounds']} rounds in {rounds['requests']} requests{small})"]


def compared(figures: dict[str, Any]) -> list[str]:
    """`telemetry.store.compare.compared`'s figures: a paragraph a group, then the renames."""
    figures = terminal_safe(figures)
    by = figures["by"]
    lines = [f"{figures['trajectories']} trajectories, {figures['tool_calls']} tool calls, by {by}; "
             f"a rate counted over fewer than {figures['small_sample_under']} is marked a small sample"]
    for group in figures["groups"]:
        lines += ["", *_group(by, group)]
    if not figures["groups"]:
        lines += ["", f"nothing recorded to compare by {by}"]
    return lines + _renames(figures)
