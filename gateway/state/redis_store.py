"""The state in a Redis that replicas share (`state_url`): the tables over `RedisMaps`, the failure
records (`RedisFailures`), the approvals (`RedisApprovals`), the upstreams' cooldowns
(`RedisCooldowns`) and the counts of the gateway keys' limits (`RedisLimitBook`), all on one
`RedisConnection`."""

from __future__ import annotations

from collections.abc import Callable

from gateway.limits.windows import LimitBook
from gateway.provider.cooldowns import CooldownRule, Cooldowns
from gateway.state.approvals import PENDING_APPROVALS, ApprovalBounds, RedisApprovals
from gateway.state.base import DEFAULT_FAILURE_BOUNDS, OWNED_RESPONSES, Bounds, FailureBounds, StateKind
from gateway.state.redis_connection import RedisConnection
from gateway.state.redis_cooldowns import RedisCooldowns
from gateway.state.redis_failures import RedisFailures
from gateway.state.redis_limits import RedisLimitBook
from gateway.state.redis_maps import RedisMaps
from gateway.state.store import StateStore


class RedisState(StateStore):
    """The state in a Redis that replicas share, under keys that start with `prefix`. Every command
    is bounded by `timeout_seconds` (see RedisConnection for what `observe`, `lost` and `unreadable`
    hear)."""

    def __init__(self, url: str, capacity: int, ttl_seconds: float, timeout_seconds: float,
                 observe: Callable[[bool], None] = lambda up: None, prefix: str = "toolspan:",
                 failure_bounds: FailureBounds = DEFAULT_FAILURE_BOUNDS, lost: Callable[[], None] = lambda: None,
                 per_key: int | None = None, owned: Bounds = OWNED_RESPONSES,
                 unreadable: Callable[[StateKind], None] = lambda kind: None,
                 approvals: ApprovalBounds = PENDING_APPROVALS) -> None:
        self.connection = RedisConnection(url, timeout_seconds, prefix, observe, lost, unreadable)
        run, report = self.connection.run, self.connection.report
        super().__init__(RedisMaps(self.connection), RedisFailures(self.connection, failure_bounds),
                         RedisApprovals(self.connection.redis, run, prefix, approvals, report),
                         Bounds(capacity, ttl_seconds, per_key), owned)

    def cooldowns(self, rule: CooldownRule) -> Cooldowns:
        return RedisCooldowns(self.connection, rule)

    def limit_book(self) -> LimitBook:
        return RedisLimitBook(self.connection)
