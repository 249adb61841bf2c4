"""What gateway keys have used of their limits, for whoever may see it: a key its own, the
operator's key (and, without keys, the one caller) every key's. GET /v1/limits
(gateway.routes.limits) answers it as JSON, which `toolspan keys usage` prints; the page
(gateway.ui.limits) shows the same."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.limits.gate import MICRO, Limiter, Usage
from gateway.settings.parts import GatewayKey

# What each count is of, by what the book counts (money: in the currency of `prices`).
UNITS = {"requests": "requests", "tokens": "tokens", "tool_calls": "tool_calls", "spend": "money"}
AT_ONCE = "at_once"  # the window of max_concurrent_requests: the requests under way now


@dataclass(frozen=True)
class KeyUsage:
    """One key's limits and what it has used of them; `key` None: the caller without keys."""

    key: str | None
    limits: tuple[Usage, ...]
    max_rounds: int | None


def whose(principal: str | None, keys: Mapping[str, GatewayKey]) -> list[str | None]:
    """The keys a caller may see the limits of: its own; every one for the operator's key; without
    keys, the one caller's (the gateway is as open as it is)."""
    if not keys:
        return [None]
    if principal is not None and principal in keys and keys[principal].operator:
        return [*sorted(keys)]
    return [principal] if principal is not None else []


async def usage_of(limiter: Limiter | None, names: list[str | None]) -> list[KeyUsage]:
    """Each named key's usage (none of any limit without a Limiter: no limit is configured).
    Raises StateUnavailable when the counts cannot be read."""
    if limiter is None:
        return [KeyUsage(name, (), None) for name in names]
    return [KeyUsage(name, tuple(await limiter.usage(name)), limiter.of(name).max_rounds) for name in names]


def amount(usage: Usage, value: int) -> int | float:
    """A count as the settings write it: money in the prices' currency, the rest as it is."""
    return value / MICRO if usage.counted == "spend" else value


def figure(value: object) -> str:
    """An amount as the table of `toolspan keys usage` and the page show it: whole numbers with
    thousands separated, money to the millionth the gateway counts; "-" for what is no number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    if isinstance(value, int) or value.is_integer():
        return f"{int(value):,}"
    return f"{value:,.6f}".rstrip("0")


def usage_json(usage: Usage) -> dict[str, Any]:
    resets_at = usage.resets_at
    return {"limit": usage.limit, "window": usage.period or AT_ONCE, "unit": UNITS.get(usage.counted, usage.counted),
            "bound": amount(usage, usage.bound), "used": amount(usage, usage.used),
            "remaining": amount(usage, usage.remaining),
            "resets_in_seconds": None if usage.resets_in is None else round(usage.resets_in, 3),
            "resets_at": None if resets_at is None else round(resets_at, 3)}


def key_usage_json(found: KeyUsage) -> dict[str, Any]:
    """One key's entry of GET /v1/limits."""
    return {"object": "key_limits", "key": found.key, "max_rounds": found.max_rounds,
            "limits": [usage_json(usage) for usage in found.limits]}
