"""Fixtures the end-to-end tests share: a real Redis (see tests.e2e.redis_server)."""

from tests.e2e.redis_server import redis_server, redis_up

__all__ = ["redis_server", "redis_up"]
