"""Guardrails' decisions (gateway.guardrails) as telemetry records them: a span event per decision,
the decision that stands as the span's attributes, the counts, the decision log records; and the
values a guardrail hid, masked in everything recorded of the call.

A call's decisions are gathered as its chain runs, at each moment, and recorded when its span
ends: a value hidden at the last moment is then masked in what the first moment said too."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from time import time_ns
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span

from gateway.guardrails import GuardrailRecord
from gateway.tools import Turn
from telemetry import names
from telemetry.bounds import bounded, utf8
from telemetry.decisions import DecisionLog, call_attributes
from telemetry.metrics import Metrics

_NAME_MAX = 128
_REASON_MAX = 1024
_DENIED = frozenset({"deny", "block"})


def standing_index(decisions: Sequence[str]) -> int:
    """Which of a call's decisions, in the order they were taken, stands: the strongest
    (names.GUARDRAIL_STRENGTH); of equals, the later, so that when all allowed it is the last
    guardrail of the chain, and when both moments decided alike, the result's. 0 for none."""
    strength = names.GUARDRAIL_STRENGTH
    best = 0
    for index, decision in enumerate(decisions):
        if strength.get(decision, 0) >= strength.get(decisions[best], 0):
            best = index
    return best


def hidden_forms(values: Iterable[object]) -> tuple[str, ...]:
    """The hidden values in each form a record may hold them (as they are, and JSON-escaped, as
    the arguments' text has them), longest first, so that a longer one is masked whole."""
    forms: set[str] = set()
    for value in values:
        text = value if isinstance(value, str) else str(value)
        if text:  # an empty value would be found everywhere
            forms.update((text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]))
    return tuple(sorted(forms, key=len, reverse=True))


def hide(text: str, forms: Sequence[str]) -> str:
    """`text` with each of the hidden `forms` in it replaced by names.GUARDRAIL_HIDDEN_MASK."""
    for form in forms:
        if form in text:
            text = text.replace(form, names.GUARDRAIL_HIDDEN_MASK)
    return text


def record_attributes(record: GuardrailRecord, forms: Sequence[str] = (), *, failed: bool = True) -> dict[str, Any]:
    """A decision as attributes: the guardrail, its decision, its moment, its reason (hidden values
    masked, then bounded) and, with `failed`, how the guardrail failed if it did."""
    attributes: dict[str, Any] = {names.ATTR_GUARDRAIL_NAME: bounded(record.guardrail, _NAME_MAX),
                                  names.ATTR_GUARDRAIL_DECISION: record.decision,
                                  names.ATTR_GUARDRAIL_MOMENT: record.moment}
    if record.reason:
        attributes[names.ATTR_GUARDRAIL_REASON] = bounded(hide(utf8(record.reason), forms), _REASON_MAX)
    if failed and record.failed is not None:
        attributes[names.ATTR_GUARDRAIL_FAILED] = bounded(record.failed, _NAME_MAX)
    return attributes


def failure_kind(failed: str) -> str:
    """The `kind` label of a guardrail that failed: it timed out, or it raised (or answered no verdict)."""
    return names.GUARDRAIL_FAILURE_TIMEOUT if failed == "timeout" else names.GUARDRAIL_FAILURE_ERROR


class GuardrailTrail:
    """One call's guardrail decisions, as its chain took them at each moment, and the values they
    hid; recorded on the call's span, in the metrics and in the decision log when the call ends."""

    __slots__ = ("_hidden", "_taken", "forms")

    def __init__(self) -> None:
        self._taken: list[tuple[GuardrailRecord, int]] = []  # each decision and when it was taken
        self._hidden: list[object] = []
        self.forms: tuple[str, ...] = ()  # hidden_forms of every hidden value so far

    def add(self, records: Sequence[GuardrailRecord], hidden: Sequence[object], at: int | None = None) -> None:
        """The decisions of one moment, taken `at` (nanoseconds since the epoch; None: now), and the
        values they hid."""
        now = time_ns() if at is None else at
        self._taken += [(record, now) for record in records]
        if hidden:
            self._hidden += hidden
            self.forms = hidden_forms(self._hidden)

    @property
    def records(self) -> list[GuardrailRecord]:
        return [record for record, _ in self._taken]

    def standing(self) -> GuardrailRecord | None:
        """The decision that stands (standing_index), None when no guardrail decided."""
        records = self.records
        return records[standing_index([r.decision for r in records])] if records else None

    def hide(self, text: str) -> str:
        return hide(text, self.forms) if self.forms else text

    def headline(self) -> str:
        """What stopped the call, in a line of its status: the guardrail that denied it or withheld
        its result, and why; "" when none did."""
        standing = self.standing()
        if standing is None or standing.decision not in _DENIED:
            return ""
        done = "denied the call" if standing.decision == "deny" else "withheld the result"
        why = self.hide(standing.reason or "").strip().split("\n", 1)[0]  # masked before it is cut
        return f"guardrail {bounded(standing.guardrail, _NAME_MAX)} {done}" + (f": {why}" if why else "")

    def hide_arguments(self, raw: str) -> str:
        """A call's raw arguments with the hidden values masked. JSON is decoded and written again
        first: a model may escape any character of a string (`\\/` for `/`), and the text it sent
        would then hold a value in no form `hidden_forms` knows."""
        if not self.forms:
            return raw
        with contextlib.suppress(ValueError, RecursionError):  # not JSON: masked as it is
            raw = json.dumps(json.loads(raw), ensure_ascii=False)
        return hide(raw, self.forms)

    def on_span(self, span: Span) -> None:
        """An event per decision, and the decision that stands as the span's attributes."""
        standing = self.standing()
        if standing is None:
            return
        for record, at in self._taken:
            span.add_event(names.EVENT_GUARDRAIL, record_attributes(record, self.forms), at)
        span.set_attributes(record_attributes(standing, self.forms, failed=False))

    def count(self, metrics: Metrics, tool_label: str) -> None:
        """Every decision by guardrail, tool and decision; every failure by guardrail and kind."""
        for record, _ in self._taken:
            metrics.guardrail_decisions.labels(record.guardrail, tool_label, record.decision).inc()
            if record.failed is not None:
                metrics.guardrail_failures.labels(record.guardrail, failure_kind(record.failed)).inc()

    def log(self, decisions: DecisionLog, context: Context, tool: str, call_id: str, turn: Turn, side: str) -> None:
        """A decision log record per decision, in the span `context` names, with the call's attributes."""
        attributes = call_attributes(tool, call_id, turn)
        attributes[names.ATTR_TOOL_SIDE] = side
        for record, _ in self._taken:
            decisions.guarded(context, {**attributes, **record_attributes(record, self.forms)},
                              record.decision in _DENIED)
