"""How a reviewer's decision on a tool call reads: to the model, a denial (gateway.tools.approvals);
next to the call, wherever a person reads it: `toolspan trajectories show` (telemetry.store.report_text)
and the trajectory page (routes.ui_timeline), whose denial reason is read back from what the model
was told (telemetry.store.timeline). Plain text: each view escapes it its own way (control characters, HTML)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_DENIED = "denied by the reviewer"  # what the model is told of a denial, then ": " and the reason if any


def denial(reason: str | None) -> str:
    """What the model is told of a denied call (its tool result), with the reviewer's reason."""
    return f"{_DENIED}: {reason}" if reason else _DENIED


def denial_reason(told: Any) -> str | None:
    """The reviewer's reason read back from what the model was told (`denial`); None without one."""
    if not isinstance(told, str) or not told.startswith(_DENIED + ": "):
        return None
    return told[len(_DENIED) + 2:] or None


def waited(milliseconds: Any) -> str:
    """A wait in seconds, as precise as a person reads it: "0.04", "2.1", "300" (a wait that ran to
    its limit overshoots it by a little, which this hides)."""
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, int | float) or milliseconds != milliseconds:
        return "?"
    seconds = milliseconds / 1000
    shown = f"{seconds:.2f}" if seconds < 0.1 else f"{seconds:.1f}" if seconds < 10 else f"{seconds:.0f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def decision_text(call: Mapping[str, Any]) -> str | None:
    """What became of a call's approval ("approved by boss after 2.1 s", "denied by boss: over the
    limit", "no decision within 300 s"), from a timeline's tool call (`decision`, `decided_by`,
    `approval_wait_ms`, `decision_reason`); None for a call that asked no one."""
    decision = call.get("decision")
    if not decision:
        return None
    by = f" by {call['decided_by']}" if call.get("decided_by") else ""
    wait = waited(call.get("approval_wait_ms"))
    if decision == "approve":
        return f"approved{by} after {wait} s"
    if decision == "deny":
        reason = call.get("decision_reason")
        return f"denied{by}: {reason}" if reason else f"denied{by}"
    if decision == "timeout":
        return f"no decision within {wait} s"
    if decision == "cancelled":
        return f"no decision: the client left after {wait} s"
    if decision == "shutdown":
        return f"no decision: the gateway shut down after {wait} s"
    if decision == "arguments_changed":
        return f"not run: approved{by} for other arguments"
    if decision == "unavailable":
        return "no approval could be asked (the state store was full or unavailable)"
    return f"{decision}{by}"  # a decision a newer gateway wrote
