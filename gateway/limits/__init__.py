"""Limits of gateway keys (issue 58): requests, tokens and tool calls per minute, requests at once,
rounds per request, tokens and money per day and per month; counted in this process or in the
Redis replicas share (gateway.state.redis_limits), enforced by `Limiter`."""

from gateway.limits.gate import Limiter, LimitObserver, RateLimited
from gateway.limits.windows import LimitBook, MemoryLimitBook, Taken

__all__ = ["LimitBook", "LimitObserver", "Limiter", "MemoryLimitBook", "RateLimited", "Taken"]
