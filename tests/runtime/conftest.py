"""A tiny app for the runtime's tests: it answers with the ids the gateway's app stamps on every response."""

from __future__ import annotations

from aiohttp import web

TRAJECTORY = "traj_0123456789abcdef"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def stamped(request: web.Request) -> web.Response:
    """A handler that sets the ids the gateway's app sets on every response."""
    return web.Response(text="hello", headers={"X-Trajectory-Id": TRAJECTORY, "X-Trace-Id": TRACE})


def tiny_app() -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stamped)
    return app
