"""The replay view (GET /ui/replay): the gateway's recorded tool calls parsed again against the
tools it serves now (gateway.improve.replay), the newest REPLAY_CALLS of them, of the viewer's key
only (every key's for an operator); the tools a key may not use are not the target of its calls.
Only parse steps run, never a body; the calls of a client's own tools are left to the terminal
(`toolspan trajectories replay --against FILE.json`), as the store does not keep their schemas.

The parse steps run on the event loop (a tool's parser may be bound to it): one view's replay at a
time, each stopped after REPLAY_SECONDS (the view then says how far it came), and each viewer's
answer kept for KEPT_SECONDS while no newer call was recorded, so that a page asked for again and
again does not replay again and again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.improve.replay import RecordedCall, replay
from gateway.improve.targets import ToolsTarget, allowlists
from gateway.settings.parts import GatewayKey
from gateway.tools import ToolRegistry
from gateway.tools.repair import RepairPolicy
from gateway.ui.layout import breakable, notice, number, table, trajectory_link, when_at
from gateway.ui.markup import EMPTY, Html, join, render, when

REPLAY_CALLS = 5000  # the newest calls a view replays: the parse steps run on the event loop
_NOT_REPLAYED_WORDS = {"no_outcome": "no outcome", "not_allowed": "refused by an allowlist",
                       "not_in_target": "tool not served", "not_recorded": "arguments not recorded",
                       "cut": "arguments cut", "unchecked": "not checkable", "no_schema": "no schema"}


def served_target(registry: ToolRegistry, keys: Mapping[str, GatewayKey], viewer: str | None,
                  repair: RepairPolicy | None) -> ToolsTarget:
    """The served tools as the calls of `viewer`'s key (None: of any key) meet them: those the key
    may use, each call against its own key's list, repaired as the gateway's executor repairs."""
    allowed = allowlists(keys)
    tools = [tool for tool in registry if viewer is None or viewer not in allowed or tool.name in allowed[viewer]]
    return ToolsTarget(tools, f"the {len(tools)} tools this gateway serves", allowed, repair)


REPLAY_SECONDS = 5.0  # the most a view spends replaying; the calls left are said to be left
KEPT_SECONDS = 60.0  # how long a viewer's answer is shown again while no newer call was recorded
_KEPT_VIEWERS = 256  # answers kept at most (one a viewer: a gateway key, or every key)

Viewer = str | None  # a gateway key's name, or None: every key's calls
_Mark = tuple[Any, ...]  # what an answer was made of: the newest call, how many, the tools


@dataclass
class Replays:
    """The page's replays: one at a time, each within `seconds`, each viewer's last answer kept for
    KEPT_SECONDS. Lives on the app; `clock` is time.monotonic but in tests."""

    seconds: float = REPLAY_SECONDS
    clock: Callable[[], float] = time.monotonic
    running: asyncio.Lock = field(default_factory=asyncio.Lock)
    kept: dict[Viewer, tuple[float, _Mark, dict[str, Any]]] = field(default_factory=dict)

    async def answer(self, viewer: Viewer, rows: Sequence[Mapping[str, Any]], target: ToolsTarget) -> dict[str, Any]:
        """`rows` (the store's recorded calls, newest first) replayed against `target`, or the answer
        kept for `viewer` when it was made of the same calls and tools less than KEPT_SECONDS ago."""
        mark = (rows[0].get("span_id") if rows else None, len(rows), target.description, tuple(target.tools))
        if (kept := self._kept(viewer, mark)) is not None:
            return kept
        async with self.running:
            if (kept := self._kept(viewer, mark)) is not None:  # made while this view waited its turn
                return kept
            answer = await replay((RecordedCall.of(row) for row in rows), target, seconds=self.seconds)
            self._keep(viewer, mark, answer)
        return answer

    def _kept(self, viewer: Viewer, mark: _Mark) -> dict[str, Any] | None:
        found = self.kept.get(viewer)
        if found is None or found[1] != mark or found[0] <= self.clock():
            return None
        return found[2]

    def _keep(self, viewer: Viewer, mark: _Mark, answer: dict[str, Any]) -> None:
        now = self.clock()
        for stale in [who for who, (until, _, _) in self.kept.items() if until <= now]:
            del self.kept[stale]
        if len(self.kept) >= _KEPT_VIEWERS:
            del self.kept[min(self.kept, key=lambda who: self.kept[who][0])]
        self.kept[viewer] = (now + KEPT_SECONDS, mark, answer)


def _totals(answer: Mapping[str, Any]) -> Html:
    items = [("calls", answer["calls"]), ("replayed", answer["replayed"]),
             ("rejections that would now pass", answer["fixed"]),
             ("passes that would now be rejected", answer["broken"]),
             ("still pass", answer["still_passing"]), ("still rejected", answer["still_rejected"]),
             ("uncertain (a masked value)", answer["uncertain"])]
    return render('<dl class="totals">{items}</dl>', items=join(
        render('<div data-figure="{name}"><dt>{name}</dt><dd>{value}</dd></div>', name=name, value=f"{value:,}")
        for name, value in items))


def _not_replayed(figures: Mapping[str, Any]) -> str:
    return "; ".join(f"{_NOT_REPLAYED_WORDS.get(why, why)} {n:,}" for why, n in figures["not_replayed"].items()) or "-"


def _tools(tools: Sequence[Mapping[str, Any]]) -> Html:
    kinds = ("fixed", "broken", "still_passing", "still_rejected", "uncertain")
    rows = [render('<tr data-tool="{tool}"><td><code>{name}</code></td>{calls}{replayed}{counts}'
                   '<td>{skipped}</td></tr>',
                   tool=row["tool"], name=breakable(row["tool"]), calls=number(row["calls"]),
                   replayed=number(row["replayed"]), counts=join(number(row[kind]) for kind in kinds),
                   skipped=_not_replayed(row))
            for row in tools]
    return table([("tool", False), ("calls", True), ("replayed", True), ("now pass", True),
                  ("now rejected", True), ("still pass", True), ("still rejected", True), ("uncertain", True),
                  ("not replayed", False)], rows, "replay-tools")


def _examples(tools: Sequence[Mapping[str, Any]], kind: str) -> Html:
    rows = [render('<tr class="{kind}"><td>{link}</td><td>{when}</td><td><code>{tool}</code></td>'
                   '<td>{recorded}</td><td><pre class="arguments">{arguments}</pre></td><td>{now}</td></tr>',
                   kind=kind, link=trajectory_link(str(example["id"]), example.get("local_id")),
                   when=when_at(example["started"]), tool=breakable(row["tool"]),
                   recorded=" ".join(str(v) for v in (example["recorded_outcome"], example["recorded_reason"]) if v),
                   arguments=str(example["arguments"]),
                   now=render('<pre class="diagnostic">{message}</pre>', message=example["now_message"])
                   if example["now_message"] else "passes")
            for row in tools for example in row[f"{kind}_examples"]]
    return table([("trajectory", False), ("when", False), ("tool", False), ("recorded", False),
                  ("arguments", False), ("now", False)], rows, f"replay-{kind}") if rows else EMPTY


def replay_page(answer: Mapping[str, Any], read: int, whose: str) -> Html:
    """The view: what was replayed against what, the totals, each tool's counts, and the calls that
    change, broken ones first."""
    if not read:
        return notice("No gateway tool call recorded yet: nothing to replay.")
    bound = f"the newest {read:,} (at most {REPLAY_CALLS:,})" if read >= REPLAY_CALLS else f"all {read:,}"
    said = (f"Recorded gateway tool calls of {whose}, {bound}, parsed again against {answer['target']} now, as "
            "their arguments were recorded: the parse step only, no tool body ran. The calls of a client's own "
            "tools are replayed in the terminal against their schemas: toolspan trajectories replay --against "
            "FILE.json.")
    partial = when(answer.get("partial"), notice(
        f"Replayed {answer['calls']:,} of {read:,} calls in the time allowed: the figures below are those of "
        "the newest calls only. toolspan trajectories replay replays them all, with no time limit."))
    hint = when(answer["not_replayed"].get("not_recorded"), notice(
        "Some calls' arguments were not recorded (by default only a rejected call's are): "
        "record_tool_arguments = true records every call's, for a replay of every pass."))
    return render('<p class="muted">{said}</p>{partial}{totals}{hint}<section class="card"><h2>Per tool</h2>'
                  '{tools}</section>'
                  '<section class="card"><h2>Recorded passes that would now be rejected</h2>{broken}</section>'
                  '<section class="card"><h2>Recorded rejections that would now pass</h2>{fixed}</section>',
                  said=said, partial=partial, totals=_totals(answer), hint=hint, tools=_tools(answer["tools"]),
                  broken=_examples(answer["tools"], "broken") or notice("None."),
                  fixed=_examples(answer["tools"], "fixed") or notice("None."))
