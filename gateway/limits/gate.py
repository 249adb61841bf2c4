"""The limits of gateway keys, enforced: a request is admitted (its requests per minute taken, a
place among the requests under way held, nothing spent to the end of a budget), each provider call
checked before it goes (its tokens estimated where a window is nearly full) and counted once it
answered (tokens, and money by the model's price), each round's tool calls taken. Past a bound the
caller gets a 429 in its API's shape with `retry-after` and the rate-limit headers OpenAI's and
Anthropic's SDKs read, so that they back off by themselves; a bound reached inside the tool loop
ends the request the same way, the rounds already run kept for the retry to resume after.

Made only when some limit is configured (`Limiter.of_settings`): without limits, nothing here runs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Literal, Protocol, get_args

from gateway.errors import GatewayError, Unavailable
from gateway.limits.windows import LimitBook, Period, Taken
from gateway.settings.parts import GatewayKey, Limits, Price

log = logging.getLogger("toolspan.limits")

MICRO = 1_000_000  # money is counted in millionths of the prices' currency: whole numbers, added atomically
# A refusal whose window frees later than this is final for an SDK's retries (a day's budget).
_RETRY_AT_MOST = 60.0

LimitName = Literal["requests_per_minute", "tokens_per_minute", "tool_calls_per_minute", "max_concurrent_requests",
                    "tokens_per_day", "tokens_per_month", "budget_per_day", "budget_per_month"]


LIMIT_ORDER = get_args(LimitName)
WhenDown = Literal["open", "closed"]


@dataclass(frozen=True, slots=True)
class Bound:
    """One configured limit: its name, what it counts in the book, over which window, up to what."""

    name: LimitName
    counted: str  # requests, tokens, tool_calls or spend (millionths)
    period: Period
    bound: int


class LimitObserver(Protocol):
    """Who hears what the limits did (telemetry: the refusals and usage metrics)."""

    def limit_refused(self, key: str, limit: str) -> None: ...

    def limit_usage(self, key: str, limit: str, used: int, bound: int) -> None: ...

    def limits_unavailable(self) -> None: ...


class RateLimited(GatewayError):
    """A limit of the caller's key refused the request (or the rest of its loop)."""

    status = 429
    type = "rate_limit_error"


def _bounds(limits: Limits) -> tuple[Bound, ...]:
    """The limits set, as what the book counts; money in millionths."""
    found: list[Bound] = []
    for name, counted, period in (("tokens_per_minute", "tokens", "minute"), ("tokens_per_day", "tokens", "day"),
                                  ("tokens_per_month", "tokens", "month")):
        if (value := getattr(limits, name)) is not None:
            found.append(Bound(name, counted, period, int(value)))  # type: ignore[arg-type]
    for name, period in (("budget_per_day", "day"), ("budget_per_month", "month")):
        if (money := getattr(limits, name)) is not None:
            found.append(Bound(name, "spend", period, round(money * MICRO)))  # type: ignore[arg-type]
    return tuple(found)


@dataclass(frozen=True)
class KeyLimits:
    """One key's limits, resolved once: the bounds on what a provider call spends (tokens, money),
    and the others by themselves."""

    requests: Bound | None
    tool_calls: Bound | None
    concurrent: int | None
    max_rounds: int | None
    spending: tuple[Bound, ...]

    @classmethod
    def of(cls, limits: Limits) -> KeyLimits:
        requests = (Bound("requests_per_minute", "requests", "minute", limits.requests_per_minute)
                    if limits.requests_per_minute is not None else None)
        tools = (Bound("tool_calls_per_minute", "tool_calls", "minute", limits.tool_calls_per_minute)
                 if limits.tool_calls_per_minute is not None else None)
        return cls(requests, tools, limits.max_concurrent_requests, limits.max_rounds, _bounds(limits))

    def windows(self) -> tuple[Bound, ...]:
        """Every limit counted over a window (all but requests at once and rounds), in LIMIT_ORDER."""
        found = [bound for bound in (self.requests, self.tool_calls) if bound is not None]
        return tuple(sorted((*found, *self.spending), key=lambda bound: LIMIT_ORDER.index(bound.name)))


@dataclass(frozen=True, slots=True)
class Usage:
    """What a key has used of one of its limits now: in the limit's window (`period`), or, for
    requests at once (no period), under way. Money is in millionths (MICRO), as the book counts it.
    `resets_in`: the seconds until the window no longer holds anything it holds now (0 when it
    holds nothing; None for requests at once, which end with their requests), from `read_at`."""

    limit: LimitName
    counted: str
    period: Period | None
    used: int
    bound: int
    resets_in: float | None
    read_at: float

    @property
    def remaining(self) -> int:
        return max(self.bound - self.used, 0)

    @property
    def resets_at(self) -> float | None:
        return None if self.resets_in is None else self.read_at + self.resets_in


def _reset_text(seconds: float) -> str:
    """A wait as OpenAI's x-ratelimit-reset-* headers write it (1s, 6m0s, 1.5s)."""
    if seconds < 60:
        return f"{max(seconds, 0):.3g}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s"


def quota_headers(kind: str, taken: Taken, now: float) -> dict[str, str]:
    """What is left of one limit, in the headers OpenAI's clients read (x-ratelimit-*-requests,
    -tokens) and Anthropic's (anthropic-ratelimit-*, the reset as a time)."""
    reset = datetime.fromtimestamp(now + taken.retry_after, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {f"x-ratelimit-limit-{kind}": str(taken.bound), f"x-ratelimit-remaining-{kind}": str(taken.remaining),
            f"x-ratelimit-reset-{kind}": _reset_text(taken.retry_after),
            f"anthropic-ratelimit-{kind}-limit": str(taken.bound),
            f"anthropic-ratelimit-{kind}-remaining": str(taken.remaining),
            f"anthropic-ratelimit-{kind}-reset": reset}


def _money(millionths: int) -> str:
    return f"{millionths / MICRO:.6f}".rstrip("0").rstrip(".")


def refusal(key: str, bound: Bound | None, limit: LimitName, taken: Taken, now: float) -> RateLimited:
    """The 429 of a limit reached: how long until it frees, in the headers SDKs back off by."""
    wait = max(taken.retry_after, 0.001)
    whose = f"gateway key {key!r}" if key else "this gateway's caller"
    counted = (f"{_money(taken.used)} of {_money(taken.bound)}" if bound is not None and bound.counted == "spend"
               else f"{taken.used} of {taken.bound}")
    headers = {"retry-after": str(math.ceil(wait)), "retry-after-ms": str(math.ceil(wait * 1000))}
    if wait > _RETRY_AT_MOST:  # an SDK's quick retries cannot help: say so (openai's SDKs read it)
        headers["x-should-retry"] = "false"
    if bound is not None and bound.period == "minute":
        headers.update(quota_headers(bound.counted.replace("_", "-"), taken, now))
    return RateLimited(f"{whose} reached its limit {limit} ({counted} used): try again in {math.ceil(wait)} s",
                       code=limit, headers=headers)


class Limiter:
    """The limits of every key, over one LimitBook (memory, or the Redis replicas share)."""

    def __init__(self, defaults: Limits, keys: Mapping[str, GatewayKey], prices: Mapping[str, Price],
                 book: LimitBook, when_down: WhenDown, observer: LimitObserver,
                 clock: Callable[[], float] = time.time) -> None:
        self._book = book
        self._observer = observer
        self._clock = clock
        self.replace(defaults, keys, prices, when_down)

    def replace(self, defaults: Limits, keys: Mapping[str, GatewayKey], prices: Mapping[str, Price],
                when_down: WhenDown) -> None:
        """These limits in place of the ones before (the settings read again: gateway.runtime.reload).
        The counts stay in the book: what a key has used in a window stays used under its new bound.
        A request under way keeps the limits it started with."""
        self._limits: dict[str | None, Limits] = {None: defaults, **{name: key.over(defaults)
                                                                     for name, key in keys.items()}}
        self._defaults = KeyLimits.of(defaults)
        self._keys = {name: KeyLimits.of(limits) for name, limits in self._limits.items() if name is not None}
        self._prices = dict(prices)
        self._when_down = when_down

    def resolved(self) -> dict[str | None, Limits]:
        """The limits of each key (its own over the defaults), and under None the defaults."""
        return dict(self._limits)

    @property
    def prices(self) -> dict[str, Price]:
        return dict(self._prices)

    @property
    def when_down(self) -> WhenDown:
        return self._when_down

    @staticmethod
    def configured(defaults: Limits, keys: Mapping[str, GatewayKey]) -> bool:
        """Whether any limit is set: without one, no Limiter is made."""
        fields = set(Limits.model_fields)
        return any(v is not None for v in defaults.model_dump(include=fields).values()) or any(
            v is not None for key in keys.values() for v in key.model_dump(include=fields).values())

    def of(self, principal: str | None) -> KeyLimits:
        return self._keys.get(principal, self._defaults) if principal is not None else self._defaults

    async def _checked(self, step: Awaitable[Taken | None]) -> Taken | None:
        """One step of the book; None when the book cannot answer and the rule is to let it through."""
        try:
            found = await step
        except Unavailable:  # the shared state's (StateUnavailable): nothing else raises it here
            if self._when_down == "closed":
                raise Unavailable("the gateway cannot check this key's limits now (its shared state is "
                                  "unreachable)", code="limits_unavailable") from None
            self._observer.limits_unavailable()
            log.warning("limits not checked: the shared state is unreachable (limits_when_state_down = open)")
            return None
        return found if isinstance(found, Taken) else None

    async def _take(self, key: str, bound: Bound, amount: int, keep: bool = True) -> dict[str, str]:
        now = self._clock()
        taken = await self._checked(self._book.take(key, bound.counted, amount, bound.bound, bound.period, now, keep))
        if taken is None:
            return {}
        self._observer.limit_usage(key, bound.name, taken.used, bound.bound)
        if not taken.allowed:
            self._observer.limit_refused(key, bound.name)
            raise refusal(key, bound, bound.name, taken, now)
        return quota_headers(bound.counted.replace("_", "-"), taken, now) if bound.period == "minute" else {}

    @asynccontextmanager
    async def admitted(self, principal: str | None, lease: str, estimate: int = 0) -> AsyncIterator[dict[str, str]]:
        """A request of `principal` under way: refused (RateLimited) when a limit of its key says
        so; else the quota headers of its answer, while its place among those under way is held.
        `estimate`: the tokens its first provider call will likely take."""
        limits, key = self.of(principal), principal or ""
        quota = await self.before_call(principal, estimate)  # a window spent (or about to be): refused at once
        if limits.concurrent is not None:
            now = self._clock()
            taken = await self._checked(self._book.enter(key, lease, limits.concurrent, now))
            if taken is not None and not taken.allowed:
                self._observer.limit_refused(key, "max_concurrent_requests")
                raise refusal(key, None, "max_concurrent_requests", taken, now)
        try:
            if limits.requests is not None:
                quota.update(await self._take(key, limits.requests, 1))
            yield quota
        finally:
            if limits.concurrent is not None:
                await self._left(key, lease)

    async def _left(self, key: str, lease: str) -> None:
        try:
            await self._book.leave(key, lease)
        except Unavailable:  # the shared state unreachable: the lease ends by itself there
            log.debug("a request's place among those under way not given back: the shared state is unreachable")

    async def before_call(self, principal: str | None, estimate: int) -> dict[str, str]:
        """A provider call about to go: refused when its key has spent a window (with `estimate`,
        the tokens it will likely use, a token window it would overrun); else the quota headers of
        the per-minute ones."""
        limits, key = self.of(principal), principal or ""
        quota: dict[str, str] = {}
        for spent in limits.spending:
            quota.update(await self._take(key, spent, max(estimate, 1) if spent.counted == "tokens" else 1,
                                          keep=False))
        return quota

    async def after_call(self, principal: str | None, model: str, input_tokens: int, output_tokens: int) -> None:
        """What an answered provider call used, counted against every window of its key's."""
        limits, key = self.of(principal), principal or ""
        if not limits.spending:
            return
        price = self.price(model)
        cost = round(input_tokens * price.input + output_tokens * price.output) if price is not None else 0
        now = self._clock()
        for spent in limits.spending:
            amount = cost if spent.counted == "spend" else input_tokens + output_tokens
            if amount:
                await self._checked(self._added(key, spent, amount, now))

    async def _added(self, key: str, bound: Bound, amount: int, now: float) -> None:
        await self._book.add(key, bound.counted, amount, bound.period, now)

    async def tool_calls(self, principal: str | None, count: int) -> None:
        """`count` tool calls about to run (or be handed to the client): taken, or refused."""
        limits = self.of(principal)
        if limits.tool_calls is not None and count:
            await self._take(principal or "", limits.tool_calls, count)

    async def usage(self, principal: str | None) -> list[Usage]:
        """What `principal`'s key (None: the one caller, without keys) has used of each of its
        limits now, in LIMIT_ORDER. Raises StateUnavailable when the book cannot be read."""
        limits, key, now = self.of(principal), principal or "", self._clock()
        found: list[Usage] = []
        for bound in limits.windows():
            # Whether a whole bound could be taken (taking nothing): refused while the window holds
            # anything, and then its wait is until the window holds none of it.
            taken = await self._book.take(key, bound.counted, bound.bound, bound.bound, bound.period, now, keep=False)
            found.append(Usage(bound.name, bound.counted, bound.period, taken.used, bound.bound,
                               max(taken.retry_after, 0.0) if taken.used else 0.0, now))
        if limits.concurrent is not None:
            # Asking to enter under a bound of 0, which no count fits: refused, with the count, and no
            # lease taken.
            under_way = (await self._book.enter(key, "", 0, now)).used
            found.append(Usage("max_concurrent_requests", "requests", None, under_way, limits.concurrent, None, now))
        return sorted(found, key=lambda usage: LIMIT_ORDER.index(usage.limit))

    def max_rounds(self, principal: str | None, default: int) -> int:
        own = self.of(principal).max_rounds
        return default if own is None else min(own, default)

    def price(self, model: str) -> Price | None:
        """The price of `model`: its own entry, else the first pattern that matches it."""
        found = self._prices.get(model)
        if found is not None:
            return found
        return next((price for pattern, price in self._prices.items() if fnmatchcase(model, pattern)), None)
