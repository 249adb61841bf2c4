"""Models compared (`toolspan trajectories report --by model`, the page's `?by=model`): the same
figures for each model, upstream, gateway key or tool, with the counts behind every rate, so that
a rate of 2 calls in 6 is not read as one of 200 in 600.

What each figure counts:
- a call's model and upstream are those of the model turn that made it (`model_turns.upstream`,
  the configured upstream the turn went to; None in a store older than schema 5); its key is its
  trajectory's gateway key (None without keys);
- a request belongs to the model and the upstream of each of its turns (one, unless it fell back
  to another), to its trajectory's key, and to each tool it called; its rounds are the model turns
  its loop ran (`requests.rounds`; a request recorded without them counts no rounds);
- rejections: rejected calls of calls, each reason's too; verbatim and corrected retries: of the
  failed calls; recoveries: recovered failures (a run of failed calls of a tool in a trajectory
  that a later ok call of the tool ended) of failures, as `telemetry.store.report` counts them.

Each rate is {"count", "of", "rate", "small_sample"}: the rate is None when "of" is 0, and
"small_sample" says "of" is under SMALL_SAMPLE. Below about 30, one call more or less moves a rate
by several points, and a 95% interval around it spans 30 points or more: such rates are shown
with their counts and marked, so that a model with 6 calls is not ranked against one with 600."""

from __future__ import annotations

import sqlite3
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from telemetry.store.calls import calls_with_models, failures, trajectory_ids
from telemetry.store.records import split_stored_id
from telemetry.store.renames import alias_suggestions, renames_by_model
from telemetry.store.rows import FAILED

SMALL_SAMPLE = 30  # a rate whose denominator is under this is marked a small sample
GROUPINGS = ("model", "upstream", "key", "tool")  # what `compared` groups by


def share(count: int, of: int) -> dict[str, Any]:
    """A rate with the counts behind it: {"count", "of", "rate" (None when of is 0), "small_sample"}."""
    return {"count": count, "of": of, "rate": count / of if of else None, "small_sample": of < SMALL_SAMPLE}


@dataclass
class _Group:
    calls: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    rounds: int = 0
    requests_with_rounds: int = 0


def _request_groups(by: str, key: str | None, turns: Sequence[dict[str, Any]],
                    calls: Sequence[dict[str, Any]]) -> Callable[[str], set[str | None]]:
    """The groups a request (its span id) of a trajectory is in: its trajectory's key; the tools
    it called; the models or upstreams of its turns (None, for a request that made none)."""
    if by == "key":
        return lambda _: {key}
    found: dict[str, set[str | None]] = defaultdict(set)
    for row in calls if by == "tool" else turns:
        found[row["request_span_id"]].add(row[by])
    if by == "tool":
        return lambda span_id: found.get(span_id, set())
    return lambda span_id: found.get(span_id) or {None}


def _gather(db: sqlite3.Connection, by: str, ids: Sequence[str]) -> tuple[dict[str | None, _Group],
                                                                          list[dict[str, Any]]]:
    """The groups of the trajectories `ids`, and all their calls (with their turns), in order."""
    groups: dict[str | None, _Group] = defaultdict(_Group)
    every: list[dict[str, Any]] = []
    for trajectory_id in ids:
        key = split_stored_id(trajectory_id)[0]
        calls, turns = calls_with_models(db, trajectory_id)
        every += calls
        for call in calls:
            groups[key if by == "key" else call[by]].calls.append(call)
        groups_of = _request_groups(by, key, turns, calls)
        for span_id, rounds in db.execute("SELECT span_id, rounds FROM requests WHERE trajectory_id = ?",
                                          (trajectory_id,)):
            for name in groups_of(span_id):
                group = groups[name]
                group.requests += 1
                if rounds is not None:
                    group.rounds += rounds
                    group.requests_with_rounds += 1
    return groups, every


def _figures(group: _Group) -> dict[str, Any]:
    calls = group.calls
    total, failed = len(calls), sum(c["outcome"] in FAILED for c in calls)
    reasons = Counter(c["rejection_reason"] for c in calls if c["rejection_reason"])
    kinds = Counter(c["retry_kind"] for c in calls if c["retry_kind"])
    episodes = failures(calls)
    recovered = [rounds for rounds in episodes if rounds is not None]
    counted = group.requests_with_rounds
    return {"calls": total, "requests": group.requests, "small_sample": total < SMALL_SAMPLE,
            "rounds_per_request": {"rounds": group.rounds, "requests": counted,
                                   "mean": group.rounds / counted if counted else None,
                                   "small_sample": counted < SMALL_SAMPLE},
            "rejections": share(sum(reasons.values()), total),
            "rejections_by_reason": {reason: share(n, total) for reason, n in reasons.most_common()},
            "failed": failed, "verbatim_retries": share(kinds["verbatim"], failed),
            "corrected_retries": share(kinds["corrected"], failed),
            "recoveries": share(len(recovered), len(episodes)),
            "rounds_to_recover": {"mean": sum(recovered) / len(recovered), "max": max(recovered)} if recovered
            else None}


def compared(db: sqlite3.Connection, by: str, *, since: float | None = None,
             key: str | None = None) -> dict[str, Any]:
    """The figures of each `by` (one of GROUPINGS) over the trajectories active at or after `since`
    (of the gateway key named `key`, when given):
    {"by", "small_sample_under": SMALL_SAMPLE, "trajectories", "tool_calls",
     "groups": [{by: name (None: no model, upstream or key), "calls", "requests", "small_sample",
                 "rounds_per_request": {"rounds", "requests", "mean", "small_sample"},
                 "rejections": rate, "rejections_by_reason": {reason: rate}, "failed",
                 "verbatim_retries": rate, "corrected_retries": rate, "recoveries": rate,
                 "rounds_to_recover": {"mean", "max"} or None}],
     "renames": [...], "aliases": [...]} (the renames and alias lines as `report` has them), each
    rate a `share`. Groups are sorted by calls, then requests, most first."""
    if by not in GROUPINGS:
        raise ValueError(f"cannot compare by {by!r}: by one of {', '.join(GROUPINGS)}")
    ids = trajectory_ids(db, since, key)
    groups, calls = _gather(db, by, ids)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1].calls), -item[1].requests,
                                                       item[0] is None, item[0] or ""))
    renames = renames_by_model(calls)
    return {"by": by, "small_sample_under": SMALL_SAMPLE, "trajectories": len(ids), "tool_calls": len(calls),
            "groups": [{by: name, **_figures(group)} for name, group in ordered],
            "renames": renames, "aliases": alias_suggestions(renames)}
