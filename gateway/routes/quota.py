"""The limits of the caller's gateway key around a request that goes to a provider (the tool loop's
routes and the pass-through): refused at once past a bound, else answered while its place among the
key's requests under way is held, its answer carrying what is left (gateway.limits)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.http.keys import CALLER, LOOP, QUOTA

BYTES_PER_TOKEN = 4


async def within_limits(request: web.Request, answer: Callable[[], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
    """`answer()`, within the caller's limits; without limits configured, just that."""
    limiter = request.app[LOOP].limiter
    if limiter is None:
        return await answer()
    caller = request[CALLER]
    # The first provider call's tokens, roughly: a token is some 4 bytes of JSON.
    estimate = (request.content_length or 0) // BYTES_PER_TOKEN
    async with limiter.admitted(caller.principal, caller.request_id, estimate) as quota:
        request[QUOTA] = quota  # on the answer's headers (gateway.app stamps them)
        return await answer()
