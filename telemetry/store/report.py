"""Questions asked of the trajectory database (`telemetry.store.columns`): pure functions over a sqlite3
connection, returning plain dicts and lists (JSON-ready) that the terminal (`toolspan
trajectories`) and the web page (`GET /ui`) both render.

Times are seconds since the epoch, durations milliseconds. Rates are fractions (0..1), None when
there is nothing to divide by. The shapes are stable: new keys may appear, none go away.

Definitions, per tool (and the same per model: the model whose turn made the call):
- rejection rate: rejected calls / calls; by reason, each reason's calls / calls;
- renames: unrecognized argument names the model sent, with the accepted name suggested for each
  (None when nothing was close), most frequent first;
- retry rates: calls that retried a failed call of the same tool in the trajectory, verbatim (same
  arguments) or corrected, / failed calls;
- recovery: a failure (a run of failed calls of the tool in a trajectory) recovers when a later call
  of the tool in that trajectory is ok; rounds to recover counts the model turns from the first failed
  call to the ok one; recovery rate: recovered failures / failures;
- stuck: a trajectory where a tool's failed call was re-sent verbatim at least STUCK_VERBATIM times
  in a row.

The same figures compared between models, upstreams, keys or tools, each rate with its counts, are
`telemetry.store.compare`'s; the renames per tool and model with the alias lines they suggest,
`telemetry.store.renames`'. One trajectory's timeline, `trajectory`, is `telemetry.store.timeline`'s
(it reads a page of requests).
"""

from __future__ import annotations

import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from telemetry.store.calls import (
    RECORDED_TURNS,
    by_trajectory_tool,
    calls_with_models,
    failures,
    of_key,
    trajectory_ids,
    turns_of,
)
from telemetry.store.records import split_stored_id
from telemetry.store.renames import alias_suggestions, renames_by_model
from telemetry.store.rows import (
    CALL_COLUMNS,
    FAILED,
    guardrail_decisions,
    named,
    selected,
    suggestions,
)
from telemetry.store.schema import read_as_current
from telemetry.store.timeline import trajectory  # one trajectory's timeline, a page at a time

STUCK_VERBATIM = 2  # as telemetry.trajectory warns: the second verbatim retry of one failure
STOPPING = ("deny", "block")  # the guardrail decisions that stop a call (its result, for a block)
STOPPED_SHOWN = 50  # the calls a guardrail stopped that the report lists
__all__ = ["FAILED", "STOPPED_SHOWN", "STOPPING", "STUCK_VERBATIM", "figures", "guardrail_figures",
           "list_trajectories", "matching_trajectories", "open_readonly", "rejections_over_time", "report",
           "trajectory"]


# --- the list ---------------------------------------------------------------------------------------

def list_trajectories(db: sqlite3.Connection, *, tool: str | None = None, outcome: str | None = None,
                      since: float | None = None, model: str | None = None,
                      limit: int = 50, key: str | None = None) -> list[dict[str, Any]]:
    """Trajectories, newest (last active) first: those with a call of `tool`, a call with
    `outcome`, activity at or after `since`, a turn of `model`, of the gateway key named `key`
    (each filter when given).

    Each: {"id" (as the store keys it), "key" (the gateway key's name, None without keys), "local_id"
    (the id the key's caller knows it by), "started", "ended", "requests", "model_turns",
    "tool_calls", "failed_calls", "rejections", "retries", "input_tokens", "output_tokens",
    "models": [...], "tools": [...], "outcomes": {outcome: calls}, "trace_ids": [...], "stuck": bool}."""
    found = matching_trajectories(db, tool=tool, outcome=outcome, since=since, model=model, limit=limit, key=key)
    return [_summary(db, *row) for row in found]


def matching_trajectories(db: sqlite3.Connection, *, tool: str | None = None, outcome: str | None = None,
                          since: float | None = None, model: str | None = None, limit: int | None = None,
                          key: str | None = None) -> list[tuple[str, float, float]]:
    """(id, started, ended) of the trajectories `list_trajectories` lists for these filters, in its
    order (a dataset of the calls, telemetry.store.dataset, selects as it does); every one without
    a `limit`."""
    condition, bounds = of_key("t.id", key)
    where: list[str] = [condition]
    params: list[Any] = [*bounds]
    if since is not None:
        where.append("t.ended >= ?")
        params.append(since)
    if tool is not None or outcome is not None:
        where.append("EXISTS (SELECT 1 FROM tool_calls c WHERE c.trajectory_id = t.id AND (? IS NULL OR c.tool = ?) "
                     "AND (? IS NULL OR c.outcome = ?))")
        params += [tool, tool, outcome, outcome]
    if model is not None:
        where.append(f"EXISTS (SELECT 1 {RECORDED_TURNS} WHERE m.trajectory_id = t.id AND m.model = ?)")
        params.append(model)
    sql = (f"SELECT id, started, ended FROM trajectories t WHERE {' AND '.join(where)} "
           "ORDER BY ended DESC LIMIT ?")
    return [(row[0], row[1], row[2]) for row in db.execute(sql, (*params, -1 if limit is None else limit))]


def _summary(db: sqlite3.Connection, trajectory_id: str, started: float, ended: float) -> dict[str, Any]:
    calls = selected(db, "tool_calls", CALL_COLUMNS, "WHERE trajectory_id = ?", (trajectory_id,))
    turns = turns_of(db, trajectory_id)
    traces = [row[0] for row in db.execute(
        "SELECT trace_id FROM requests WHERE trajectory_id = ? ORDER BY started", (trajectory_id,))]
    return {**named(trajectory_id), "started": started, "ended": ended, "requests": len(traces),
            "model_turns": len(turns), "tool_calls": len(calls),
            "failed_calls": sum(c["outcome"] in FAILED for c in calls),
            "rejections": sum(c["outcome"] == "rejected" for c in calls),
            "retries": sum(c["retry_kind"] is not None for c in calls),
            "input_tokens": sum(t["input_tokens"] or 0 for t in turns),
            "output_tokens": sum(t["output_tokens"] or 0 for t in turns),
            "models": sorted({t["model"] for t in turns if t["model"]}),
            "tools": sorted({c["tool"] for c in calls}),
            "outcomes": dict(Counter(c["outcome"] for c in calls)), "trace_ids": list(dict.fromkeys(traces)),
            "stuck": bool(_stuck(calls))}


# --- the report -------------------------------------------------------------------------------------

def report(db: sqlite3.Connection, *, since: float | None = None, key: str | None = None) -> dict[str, Any]:
    """The figures per tool and per model, over the trajectories active at or after `since` (of the
    gateway key named `key`, when given):
    {"trajectories", "tool_calls", "model_turns", "input_tokens", "output_tokens",
     "overall": figures, "tools": [{"tool", "side", **figures}], "models": [{"model", **figures}],
     "stuck": [{"trajectory_id", "key", "local_id", "tool", "model", "verbatim_retries"}],
     "guardrails": {"decisions": [{"guardrail", "decision", "count"}], "failures": {guardrail: n},
                    "stopped_calls", "stopped": [{"id", "key", "local_id", "span_id", "tool", "side", "started",
                                                  "guardrail", "decision", "moment", "reason"}]},
     "renames": [{"tool", "side", "model", "from", "to", "count", "recovered"}],
     "aliases": [{"tool", "aliases": {accepted: [sent, ...]}, "toml"}]} (`telemetry.store.renames`), where
    figures is
    {"calls", "outcomes": {outcome: n}, "failed", "rejections", "rejection_rate",
     "rejections_by_reason": {reason: {"count", "rate"}}, "renames": [{"from", "to", "count"}],
     "retries": {"verbatim", "corrected", "verbatim_rate", "corrected_rate"},
     "failures", "recoveries", "recovery_rate", "rounds_to_recover": {"mean", "max"} or None,
     "stuck_trajectories": [ids]}. Tools and models are sorted by calls, most first."""
    ids = trajectory_ids(db, since, key)
    calls: list[dict[str, Any]] = []
    turn_count = input_tokens = output_tokens = 0
    for trajectory_id in ids:
        found, turns = calls_with_models(db, trajectory_id)
        calls += found
        turn_count += len(turns)
        input_tokens += sum(t["input_tokens"] or 0 for t in turns)
        output_tokens += sum(t["output_tokens"] or 0 for t in turns)
    by_tool, by_model = defaultdict(list), defaultdict(list)
    for call in calls:
        by_tool[call["tool"]].append(call)
        by_model[call["model"] or "(none)"].append(call)
    # A name is one side's (a client tool named like a gateway tool is refused): the side of its calls.
    tools = [{**group, "side": by_tool[group["tool"]][0]["side"]} for group in _grouped(by_tool, "tool")]
    renamed = renames_by_model(calls)
    return {"trajectories": len(ids), "tool_calls": len(calls), "model_turns": turn_count,
            "input_tokens": input_tokens, "output_tokens": output_tokens, "overall": figures(calls),
            "tools": tools, "models": _grouped(by_model, "model"), "stuck": _stuck(calls),
            "guardrails": guardrail_figures(calls), "renames": renamed, "aliases": alias_suggestions(renamed)}


def _grouped(groups: dict[str, list[dict[str, Any]]], key: str) -> list[dict[str, Any]]:
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return [{key: name, **figures(calls)} for name, calls in ordered]


def figures(calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The report's figures for some tool calls (with "turn", as `report` reads them), in order."""
    total = len(calls)
    failed = sum(c["outcome"] in FAILED for c in calls)
    reasons = Counter(c["rejection_reason"] for c in calls if c["rejection_reason"])
    kinds = Counter(c["retry_kind"] for c in calls if c["retry_kind"])
    episodes = failures(calls)
    recovered = [rounds for rounds in episodes if rounds is not None]
    return {"calls": total, "outcomes": dict(Counter(c["outcome"] for c in calls)), "failed": failed,
            "rejections": sum(reasons.values()), "rejection_rate": _rate(sum(reasons.values()), total),
            "rejections_by_reason": {r: {"count": n, "rate": _rate(n, total)} for r, n in reasons.most_common()},
            "renames": _renames(calls),
            "retries": {"verbatim": kinds["verbatim"], "corrected": kinds["corrected"],
                        "verbatim_rate": _rate(kinds["verbatim"], failed),
                        "corrected_rate": _rate(kinds["corrected"], failed)},
            "failures": len(episodes), "recoveries": len(recovered), "recovery_rate": _rate(len(recovered),
                                                                                            len(episodes)),
            "rounds_to_recover": {"mean": sum(recovered) / len(recovered), "max": max(recovered)} if recovered
            else None,
            "stuck_trajectories": sorted({s["trajectory_id"] for s in _stuck(calls)})}


def guardrail_figures(calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What guardrails decided on some tool calls (in order): every decision counted by guardrail and
    decision, most first; the failed ones by guardrail; the calls a guardrail stopped (denied, or
    whose result it withheld), the newest STOPPED_SHOWN of them, newest first."""
    decided: Counter[tuple[str, str]] = Counter()
    failed: Counter[str] = Counter()
    for call in calls:
        for decision in guardrail_decisions(call):
            decided[(str(decision.get("guardrail")), str(decision.get("decision")))] += 1
            if decision.get("failed"):
                failed[str(decision.get("guardrail"))] += 1
    stopped = [call for call in calls if call["guardrail_decision"] in STOPPING]
    stopped.sort(key=lambda call: call["started"], reverse=True)
    return {"decisions": [{"guardrail": guardrail, "decision": decision, "count": n} for (guardrail, decision), n
                          in sorted(decided.items(), key=lambda item: (-item[1], item[0]))],
            "failures": dict(failed.most_common()), "stopped_calls": len(stopped),
            "stopped": [{**named(call["trajectory_id"] or ""), "span_id": call["span_id"], "tool": call["tool"],
                         "side": call["side"], "started": call["started"], "guardrail": call["guardrail"],
                         "decision": call["guardrail_decision"], "moment": call["guardrail_moment"],
                         "reason": call["guardrail_reason"]}
                        for call in stopped[:STOPPED_SHOWN]]}


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _renames(calls: Iterable[dict[str, Any]], top: int = 10) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str | None]] = Counter()
    for call in calls:
        suggested = call["suggestions"] if isinstance(call["suggestions"], dict) else suggestions(call["suggestions"])
        for name in call["unrecognized"] or ():
            counts[(name, suggested.get(name))] += 1
    return [{"from": sent, "to": accepted, "count": n} for (sent, accepted), n in counts.most_common(top)]


def _stuck(calls: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trajectories and tools where the model re-sent one failed call verbatim STUCK_VERBATIM times
    or more in a row; the longest run of each."""
    found = []
    for (trajectory_id, tool), group in by_trajectory_tool(calls).items():
        run = longest = 0
        for call in group:
            run = run + 1 if call["retry_kind"] == "verbatim" else 0
            longest = max(longest, run)
        if longest >= STUCK_VERBATIM:
            key, local_id = split_stored_id(trajectory_id or "")
            found.append({"trajectory_id": trajectory_id, "key": key, "local_id": local_id, "tool": tool,
                          "model": group[-1].get("model"), "verbatim_retries": longest})
    return found


def rejections_over_time(db: sqlite3.Connection, *, bucket_seconds: float = 3600.0,
                         since: float | None = None, key: str | None = None) -> list[dict[str, Any]]:
    """Calls and rejections per tool per time bucket, oldest first (for a chart), of the gateway key
    named `key` when given: [{"tool", "bucket_start", "calls", "rejections", "rejection_rate"}]."""
    condition, params = of_key("trajectory_id", key)
    sql = ("SELECT tool, CAST(started / ? AS INTEGER) * ? AS bucket, COUNT(*), SUM(outcome = 'rejected') "
           f"FROM tool_calls WHERE started >= ? AND {condition} GROUP BY tool, bucket ORDER BY bucket, tool")
    rows = db.execute(sql, (bucket_seconds, bucket_seconds, since if since is not None else float("-inf"), *params))
    return [{"tool": tool, "bucket_start": float(bucket), "calls": n, "rejections": int(rejected or 0),
             "rejection_rate": _rate(int(rejected or 0), n)} for tool, bucket, n, rejected in rows]


def open_readonly(path: str) -> sqlite3.Connection:
    """A connection that reads the store at `path` without creating or changing it; a store an older
    toolspan wrote reads as this version's (schema.read_as_current)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    db = sqlite3.connect(uri, uri=True)
    try:
        return read_as_current(db)
    except BaseException:
        db.close()
        raise
