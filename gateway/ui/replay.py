"""The replay view (GET /ui/replay): the gateway's recorded tool calls parsed again against the
tools it serves now (gateway.improve.replay), the newest REPLAY_CALLS of them, of the viewer's key
only (every key's for an operator); the tools a key may not use are not the target of its calls.
Only parse steps run, never a body; the calls of a client's own tools are left to the terminal
(`toolspan trajectories replay --against FILE.json`), as the store does not keep their schemas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.improve.replay import RecordedCall, replay
from gateway.improve.targets import ToolsTarget
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
    allowed = {name: frozenset(spec.tools) for name, spec in keys.items() if spec.tools is not None}
    tools = [tool for tool in registry if viewer is None or viewer not in allowed or tool.name in allowed[viewer]]
    return ToolsTarget(tools, f"the {len(tools)} tools this gateway serves", allowed, repair)


async def replayed(rows: Sequence[Mapping[str, Any]], target: ToolsTarget) -> dict[str, Any]:
    return await replay((RecordedCall.of(row) for row in rows), target)


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
    if not answer["calls"]:
        return notice("No gateway tool call recorded yet: nothing to replay.")
    bound = f"the newest {read:,} (at most {REPLAY_CALLS:,})" if read >= REPLAY_CALLS else f"all {read:,}"
    said = (f"Recorded gateway tool calls of {whose}, {bound}, parsed again against {answer['target']} now, as "
            "their arguments were recorded: the parse step only, no tool body ran. The calls of a client's own "
            "tools are replayed in the terminal against their schemas: toolspan trajectories replay --against "
            "FILE.json.")
    hint = when(answer["not_replayed"].get("not_recorded"), notice(
        "Some calls' arguments were not recorded (by default only a rejected call's are): "
        "record_tool_arguments = true records every call's, for a replay of every pass."))
    return render('<p class="muted">{said}</p>{totals}{hint}<section class="card"><h2>Per tool</h2>{tools}</section>'
                  '<section class="card"><h2>Recorded passes that would now be rejected</h2>{broken}</section>'
                  '<section class="card"><h2>Recorded rejections that would now pass</h2>{fixed}</section>',
                  said=said, totals=_totals(answer), hint=hint, tools=_tools(answer["tools"]),
                  broken=_examples(answer["tools"], "broken") or notice("None."),
                  fixed=_examples(answer["tools"], "fixed") or notice("None."))
