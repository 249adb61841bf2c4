"""A finished tool call's outcome as its span says it and its metrics count it: the outcome (a
call run on repaired arguments is `repaired`), why it failed, what the check of its argument names
found, the aliases it used and what argument repair found (gateway.tools.aliases, .repair)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from gateway.tools import NameCheck, ToolOutcome
from gateway.tools.results import Repair
from telemetry import names
from telemetry.arguments import render_arguments
from telemetry.bounds import bounded, utf8
from telemetry.metrics import Metrics

_NAME_MAX = 128  # a model's argument names, as a span shows them


def names_found(check: NameCheck) -> str:
    """What the check of a call's argument names found, in one line: the missing names, and the
    unrecognised ones with the name each most likely meant."""
    meant = dict(check.suggestions)
    found = []
    if check.missing:
        found.append("missing " + ", ".join(check.missing))
    if check.unrecognized:
        sent = (f"{bounded(n, _NAME_MAX)} (did you mean {meant[n]}?)" if n in meant else bounded(n, _NAME_MAX)
                for n in check.unrecognized)
        found.append("unrecognized " + ", ".join(sent))
    return "; ".join(found)


def name_check_attributes(check: NameCheck) -> dict[str, Any]:
    """What the check of a call's argument names found, as span attributes: the names missing,
    those not recognised and the suggestions for them (a model's names bounded in length)."""
    attributes: dict[str, Any] = {}
    if check.missing:
        attributes[names.ATTR_ARGS_MISSING] = tuple(check.missing)
    if check.unrecognized:
        attributes[names.ATTR_ARGS_UNRECOGNIZED] = tuple(bounded(n, _NAME_MAX) for n in check.unrecognized)
    if check.suggestions:
        attributes[names.ATTR_ARGS_SUGGESTIONS] = tuple(f"{bounded(a, _NAME_MAX)}->{b}" for a, b in check.suggestions)
    return attributes


def outcome_label(outcome: ToolOutcome) -> str:
    """A call's outcome as spans and metrics name it: its status, or `repaired` for a call that ran
    on repaired arguments and returned."""
    if outcome.repair is not None and outcome.repair.applied and outcome.status == "ok":
        return names.OUTCOME_REPAIRED
    return outcome.status


def outcome_attributes(outcome: ToolOutcome, label: str, max_chars: int, redact_keys: Sequence[str],
                       hide: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The attributes of a finished call's span that its outcome gives: the outcome (`label`), why it
    failed, what the name check found, the aliases used and what repair found (its arguments with
    the values guardrails hid masked by `hide`, as the call's own are)."""
    attributes: dict[str, Any] = {names.ATTR_OUTCOME: label}
    if outcome.error_type is not None:
        attributes[names.ATTR_ERROR_TYPE] = outcome.error_type
    if outcome.rejection is not None:
        attributes[names.ATTR_REJECTION_REASON] = outcome.rejection.reason
    if outcome.unchecked is not None:
        attributes[names.ATTR_UNCHECKED_REASON] = outcome.unchecked
    if outcome.names is not None:
        attributes.update(name_check_attributes(outcome.names))
    if outcome.aliases:
        attributes[names.ATTR_ARGS_ALIASES] = [f"{alias}->{name}" for alias, name in outcome.aliases]
    if outcome.repair is not None:
        attributes.update(repair_attributes(outcome.repair, max_chars, redact_keys, hide))
    return attributes


def repair_attributes(repair: Repair, max_chars: int, redact_keys: Sequence[str],
                      hide: Callable[[str], str] | None = None) -> dict[str, Any]:
    """What repair found for a call, its arguments redacted and bounded as the call's own are."""
    def shown(arguments: dict[str, Any]) -> str:
        raw = json.dumps(arguments, ensure_ascii=False, default=str)
        return utf8(render_arguments(raw if hide is None else hide(raw), max_chars, redact_keys))

    return {names.ATTR_REPAIR_MODE: names.REPAIR_APPLY if repair.applied else names.REPAIR_OBSERVE,
            names.ATTR_REPAIR_CHANGES: list(repair.changes), names.ATTR_REPAIR_BEFORE: shown(repair.before),
            names.ATTR_REPAIR_AFTER: shown(repair.after)}


def count_mended(metrics: Metrics, tool: str, outcome: ToolOutcome) -> None:
    """The aliases a call of `tool` (its metric label) used, and the repair found for it."""
    for _, parameter in outcome.aliases:
        metrics.tool_aliases_used.labels(tool, parameter).inc()
    if outcome.repair is not None:
        mode = names.REPAIR_APPLY if outcome.repair.applied else names.REPAIR_OBSERVE
        metrics.tool_repairs.labels(tool, mode).inc()
