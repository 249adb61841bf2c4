"""Retrying a provider call after gateway tools ran, within the request.

Once the gateway has run a tool for a request, a provider failure of a later round must not go to
the client as a retryable error: every SDK would resend the whole request and the tool would run
again. So the gateway retries such a failure itself (a 429, a 5xx that says "try again", a broken
connection), waiting as the provider asks (`retry-after`, `retry-after-ms`) or with exponential
backoff, within a bound of attempts and of time. What still fails is told to the client as final
(`x-should-retry: false`, see `FailedAfterTools`). The first round keeps the client's own retries:
nothing has run yet, so resending is harmless.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import GatewayError, UpstreamRefused, UpstreamUnavailable
from gateway.provider.errors import RETRYABLE_STATUSES
from gateway.settings.model import Settings

BACKOFF_CAP_SECONDS = 8.0  # the longest wait between two attempts without a retry-after (openai-python's)


@dataclass(frozen=True)
class RetryPolicy:
    """How a provider call after gateway tools is retried: `attempts` more times at most, waiting
    at most `max_seconds` in all; waits start at `backoff_seconds` and double (with jitter)."""

    attempts: int = 2
    max_seconds: float = 20.0
    backoff_seconds: float = 0.5

    def start(self) -> Retrying:
        """The retry state of one provider call."""
        return Retrying(self)


def retry_policy(settings: Settings) -> RetryPolicy:
    """The policy the settings give."""
    return RetryPolicy(settings.upstream_retry_attempts, settings.upstream_retry_max_seconds,
                       settings.upstream_retry_backoff_seconds)


def retryable(error: GatewayError) -> bool:
    """Whether the provider's failure says that the same request may succeed later."""
    if isinstance(error, UpstreamRefused):
        return error.status in RETRYABLE_STATUSES  # of the 4xx, a 429
    return isinstance(error, UpstreamUnavailable) and error.retryable


def asked_wait(headers: Mapping[str, str]) -> float | None:
    """The wait the provider asked for, in seconds: `retry-after-ms` (OpenAI's), else `retry-after`
    in seconds (an HTTP date is not honoured: providers send seconds, and a clock skew would make it
    meaningless)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            value = float(lowered[name]) * scale
        except (KeyError, ValueError):
            continue
        if value >= 0 and value == value:  # not NaN
            return value
    return None


class Retrying:
    """One provider call's attempts: which one this is, and how long to wait before the next."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempt = 1  # the attempt under way, from 1
        self._waited = 0.0

    def wait(self, error: GatewayError) -> float | None:
        """How long to wait before trying again after `error`, or None: do not try again (the error
        is not retryable, the attempts are used up, or the wait would pass the time bound)."""
        if not retryable(error) or self.attempt > self.policy.attempts:
            return None
        asked = asked_wait(error.headers)
        backoff = min(BACKOFF_CAP_SECONDS, self.policy.backoff_seconds * 2 ** (self.attempt - 1))
        # Jitter spreads the retries of many requests hit by one outage (a quarter, as openai-python).
        delay = asked if asked is not None else backoff * (1 - 0.25 * random.random())
        if self._waited + delay > self.policy.max_seconds:
            return None
        self._waited += delay
        self.attempt += 1
        return delay
