"""A replay's answer (gateway.improve.replay.replay) as terminal text: the totals, then each tool's
counts with its broken and fixed calls. Every stored string (a tool's name, a trajectory's id, the
arguments, the text the model would now get) has its control characters made visible
(gateway.wire.escaping), so that no value can move the cursor or start a line of its own."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gateway.wire.escaping import visible, visible_lines

_CHANGE_WORDS = (("broken", "broken"), ("fixed", "fixed"), ("still_passing", "still pass"),
                 ("still_rejected", "still rejected"), ("uncertain", "uncertain (a masked value)"))
_NOT_REPLAYED_WORDS = {"no_outcome": "without an outcome", "not_allowed": "refused by a key's allowlist",
                       "no_schema": "client tool calls without a schema (--against FILE gives one)",
                       "not_in_target": "of tools not in the target",
                       "not_recorded": "whose arguments were not recorded", "cut": "whose arguments were cut to length",
                       "unchecked": "the target could not check"}
RECORDING_HINT = ("(the gateway records every call's arguments with record_tool_arguments = true, or "
                  "TOOLSPAN_RECORD_TOOL_ARGUMENTS=true; by default only a rejected call's)")
MESSAGE_LINES = 6  # lines of what the model would now be told, shown under an example


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _calls(count: int) -> str:
    return f"{count:,} call" if count == 1 else f"{count:,} calls"


def _counts(figures: Mapping[str, Any]) -> str:
    shown = [f"{figures[kind]:,} {words}" for kind, words in _CHANGE_WORDS if figures[kind]]
    if figures["repaired"]:
        shown.append(f"{figures['repaired']:,} passing once repaired")
    return ", ".join(shown) or "none replayed"


def _not_replayed(figures: Mapping[str, Any]) -> str:
    return ", ".join(f"{n:,} {_NOT_REPLAYED_WORDS.get(why, why)}" for why, n in figures["not_replayed"].items())


def replay(answer: Mapping[str, Any]) -> list[str]:
    """The lines `toolspan trajectories replay` prints."""
    lines = [f"replayed against {visible(str(answer['target']))}: the parse step only, no tool body ran",
             f"{_calls(answer['calls'])} recorded, {answer['replayed']:,} replayed:",
             f"  {answer['fixed']:,} recorded rejections would now pass (fixed)",
             f"  {answer['broken']:,} recorded passes would now be rejected (broken)",
             f"  {answer['still_passing']:,} still pass, {answer['still_rejected']:,} still rejected"
             + (f", {answer['uncertain']:,} uncertain (a masked value stands in the arguments)"
                if answer["uncertain"] else "")]
    if answer["repaired"]:
        lines.append(f"  of the calls that pass, {answer['repaired']:,} pass once argument repair mends them")
    if answer["not_replayed"]:
        lines.append(f"  not replayed: {_not_replayed(answer)}")
        if answer["not_replayed"].get("not_recorded"):
            lines.append(f"    {RECORDING_HINT}")
    if answer["tools"]:
        lines += ["", "per tool:"]
    for tool in answer["tools"]:
        lines += _tool(tool)
    return lines


def _tool(figures: Mapping[str, Any]) -> list[str]:
    name = visible(str(figures["tool"])) + (" (client tool)" if figures["side"] == "client" else "")
    lines = [f"  {name}: {_calls(figures['calls'])}, {figures['replayed']:,} replayed: {_counts(figures)}"]
    if figures["not_replayed"]:
        lines.append(f"    not replayed: {_not_replayed(figures)}")
    for kind in ("broken", "fixed"):
        lines += [line for example in figures[f"{kind}_examples"] for line in _example(kind, example)]
        if (more := figures[kind] - len(figures[f"{kind}_examples"])) > 0:
            lines.append(f"    and {more:,} more {kind} (--examples N shows more)")
    return lines


def _example(kind: str, example: Mapping[str, Any]) -> list[str]:
    recorded = visible(str(example["recorded_outcome"]))
    if example["recorded_reason"]:
        recorded += f" ({visible(str(example['recorded_reason']))})"
    now = "passes" if kind == "fixed" else f"rejected ({visible(str(example['now_reason']))})"
    lines = [f"    {kind}: {_when(example['started'])}  trajectory {visible(str(example['id']))}  span "
             f"{visible(str(example['span_id']))}: recorded {recorded}, now {now}",
             f"      arguments: {visible(str(example['arguments']))}"]
    message = visible_lines(str(example["now_message"] or "")).splitlines()
    lines += [f"      | {line}" for line in message[:MESSAGE_LINES]]
    if len(message) > MESSAGE_LINES:
        lines.append(f"      | ... ({len(message) - MESSAGE_LINES} more lines)")
    return lines
