"""Retries within a trajectory: a call that follows a failed call of the same tool.

`verbatim` when the arguments are the same JSON as the failed call's, `corrected` otherwise.
A trajectory is scoped by the gateway key (the principal) that runs it: one key's call is never
a retry of another's, whatever trajectory id both send. The state is one record per
(principal, trajectory, tool) that last failed, in a `FailureBook` (gateway.state: this
process's memory, or the Redis replicas share) within its `FailureBounds`. Tool names are
kept as given: the caller bounds them (telemetry passes its metric label, `__unknown__` for
every name outside the registry).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Literal

from opentelemetry.trace import SpanContext, TraceFlags

from gateway.state import FailureBook, FailureRecords

log = logging.getLogger("toolspan.trajectory")

RetryKind = Literal["verbatim", "corrected"]


def canonical(raw: str) -> str:
    """A digest of the arguments as comparable JSON (key order and spacing ignored; raw text if
    not JSON). A digest, so that what the state holds per failure stays small."""
    try:
        text = json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        text = raw.strip()
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Failure:
    span: SpanContext
    arguments: str  # canonical() digest
    verbatim_retries: int  # verbatim retries of this failure so far


@dataclass(frozen=True)
class Retry:
    kind: RetryKind
    retries: SpanContext  # the failed call this one retries
    verbatim_retries: int  # counting this one, when verbatim


class Trajectories:
    """Retry classification over a `FailureBook`: this process's memory (the default), or the
    state store replicas share, so that a retry is recognised whichever replica ran the failed
    call. Only failures are written: a call that fails, and a call that repairs one."""

    def __init__(self, book: FailureBook | None = None) -> None:
        self.book: FailureBook = book if book is not None else FailureRecords()

    async def classify(self, trajectory_id: str | None, tool: str, arguments: str,
                       principal: str | None = None) -> Retry | None:
        """Whether a call starting now retries an earlier failed call of the same tool, by the
        same principal. Raises StateUnavailable when the shared store cannot answer."""
        if trajectory_id is None:
            return None
        record = await self.book.failure(principal, trajectory_id, tool)
        failure = _failure_of(record) if record is not None else None
        if failure is None:
            return None
        if canonical(arguments) != failure.arguments:
            return Retry("corrected", failure.span, 0)
        repeats = failure.verbatim_retries + 1
        if repeats >= 2:  # the loop where a model keeps re-sending a call that cannot succeed
            log.warning("trajectory %s: the model sent the same failing call to %s again (verbatim retry %d)",
                        trajectory_id, tool[:80], repeats)
        return Retry("verbatim", failure.span, repeats)

    async def record(self, trajectory_id: str | None, tool: str, arguments: str, span: SpanContext, failed: bool,
                     retry: Retry | None, principal: str | None = None) -> None:
        """Remember a failed call (for the next retry), or forget the failure a success repaired.
        Raises StateUnavailable when the shared store cannot take it."""
        if trajectory_id is None or not (failed or retry is not None):
            return
        record = None
        if failed:
            repeats = retry.verbatim_retries if retry is not None and retry.kind == "verbatim" else 0
            record = _record_of(Failure(span, canonical(arguments), repeats))
        await self.book.remember_failure(principal, trajectory_id, tool, record)


def _record_of(failure: Failure) -> str:
    span = failure.span
    return f"{span.trace_id:032x} {span.span_id:016x} {int(span.trace_flags):02x} {failure.arguments} " \
           f"{failure.verbatim_retries}"


def _failure_of(record: str) -> Failure | None:
    """The failure a record holds; None for one this version cannot read."""
    try:
        trace_id, span_id, flags, arguments, repeats = record.split(" ")
        span = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16)))
        return Failure(span, arguments, int(repeats))
    except ValueError:
        return None
