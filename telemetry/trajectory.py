"""Retries within a trajectory: a call that follows a failed call of the same tool.

`verbatim` when the arguments are the same JSON as the failed call's, `corrected` otherwise.
The state is one record per (trajectory, tool) that last failed, bounded in trajectories and in
records per trajectory, and dropped when unused for `ttl_seconds`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from opentelemetry.trace import SpanContext

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


@dataclass
class _Trajectory:
    expires: float
    failures: OrderedDict[str, Failure]


class Trajectories:
    def __init__(self, capacity: int = 10_000, ttl_seconds: float = 3600.0, tools_per_trajectory: int = 64,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._items: OrderedDict[str, _Trajectory] = OrderedDict()
        self._capacity = capacity
        self._ttl = ttl_seconds
        self._per_trajectory = tools_per_trajectory
        self._clock = clock

    def __len__(self) -> int:
        return len(self._items)

    def classify(self, trajectory_id: str | None, tool: str, arguments: str) -> Retry | None:
        """Whether a call starting now retries an earlier failed call of the same tool."""
        if trajectory_id is None:
            return None
        entry = self._items.get(trajectory_id)
        if entry is None or entry.expires <= self._clock():
            return None
        failure = entry.failures.get(tool)
        if failure is None:
            return None
        if canonical(arguments) != failure.arguments:
            return Retry("corrected", failure.span, 0)
        repeats = failure.verbatim_retries + 1
        if repeats >= 2:  # the loop where a model keeps re-sending a call that cannot succeed
            log.warning("trajectory %s: the model sent the same failing call to %s again (verbatim retry %d)",
                        trajectory_id, tool[:80], repeats)
        return Retry("verbatim", failure.span, repeats)

    def record(self, trajectory_id: str | None, tool: str, arguments: str, span: SpanContext, failed: bool,
               retry: Retry | None) -> None:
        """Remember a failed call (for the next retry), or forget the failure a success repaired."""
        if trajectory_id is None:
            return
        now = self._clock()
        entry = self._items.get(trajectory_id)
        if entry is None or entry.expires <= now:
            if not failed:
                return
            entry = self._admit(trajectory_id, now)
        entry.expires = now + self._ttl
        self._items.move_to_end(trajectory_id)
        if not failed:
            entry.failures.pop(tool, None)
            return
        repeats = retry.verbatim_retries if retry is not None and retry.kind == "verbatim" else 0
        entry.failures.pop(tool, None)
        entry.failures[tool] = Failure(span, canonical(arguments), repeats)
        while len(entry.failures) > self._per_trajectory:
            entry.failures.popitem(last=False)

    def _admit(self, trajectory_id: str, now: float) -> _Trajectory:
        while self._items:
            oldest_id, oldest = next(iter(self._items.items()))
            if oldest.expires > now and len(self._items) < self._capacity:
                break
            del self._items[oldest_id]  # expired, or the least recently used one past capacity
        entry = _Trajectory(now + self._ttl, OrderedDict())
        self._items[trajectory_id] = entry
        return entry
