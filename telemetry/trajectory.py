"""Retries within a trajectory: a call that follows a failed call of the same tool.

`verbatim` when the arguments are the same JSON as the failed call's, `corrected` otherwise.
A trajectory is scoped by the gateway key (the principal) that runs it: one key's call is never
a retry of another's, whatever trajectory id both send. The state is one record per
(principal, trajectory, tool) that last failed, bounded in trajectories, in records per
trajectory and in records overall, and dropped when unused for `ttl_seconds`. Tool names are
kept as given: the caller bounds them (telemetry passes its metric label, `__unknown__` for
every name outside the registry).
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


_Key = tuple[str | None, str]  # (principal, trajectory id)


class Trajectories:
    def __init__(self, capacity: int = 10_000, ttl_seconds: float = 3600.0, tools_per_trajectory: int = 64,
                 clock: Callable[[], float] = time.monotonic, failure_capacity: int = 50_000) -> None:
        self._items: OrderedDict[_Key, _Trajectory] = OrderedDict()
        self._capacity = capacity
        self._ttl = ttl_seconds
        self._per_trajectory = tools_per_trajectory
        self._failure_capacity = failure_capacity
        self._clock = clock
        self.failures = 0  # records held, over every trajectory

    def __len__(self) -> int:
        return len(self._items)

    def classify(self, trajectory_id: str | None, tool: str, arguments: str,
                 principal: str | None = None) -> Retry | None:
        """Whether a call starting now retries an earlier failed call of the same tool, by the
        same principal."""
        if trajectory_id is None:
            return None
        entry = self._items.get((principal, trajectory_id))
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
               retry: Retry | None, principal: str | None = None) -> None:
        """Remember a failed call (for the next retry), or forget the failure a success repaired."""
        if trajectory_id is None:
            return
        key, now = (principal, trajectory_id), self._clock()
        entry = self._items.get(key)
        if entry is None or entry.expires <= now:
            if not failed:
                return
            entry = self._admit(key, now)
        entry.expires = now + self._ttl
        self._items.move_to_end(key)
        self.failures -= len(entry.failures)
        entry.failures.pop(tool, None)
        if failed:
            repeats = retry.verbatim_retries if retry is not None and retry.kind == "verbatim" else 0
            entry.failures[tool] = Failure(span, canonical(arguments), repeats)
            while len(entry.failures) > self._per_trajectory:
                entry.failures.popitem(last=False)
        self.failures += len(entry.failures)
        self._evict(now, keep=key)

    def _admit(self, key: _Key, now: float) -> _Trajectory:
        stale = self._items.pop(key, None)  # expired: its records go
        self.failures -= len(stale.failures) if stale is not None else 0
        self._evict(now, room=1)
        entry = _Trajectory(now + self._ttl, OrderedDict())
        self._items[key] = entry
        return entry

    def _evict(self, now: float, room: int = 0, keep: _Key | None = None) -> None:
        """Drop the least recently used trajectories while they are expired or past a capacity
        (leaving `room` trajectories free); never `keep`, the one just written."""
        while self._items:
            oldest_key, oldest = next(iter(self._items.items()))
            if oldest_key == keep or (oldest.expires > now and len(self._items) + room <= self._capacity
                                      and self.failures <= self._failure_capacity):
                break
            del self._items[oldest_key]
            self.failures -= len(oldest.failures)
