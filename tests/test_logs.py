"""Logging for operators: the JSON formatter, the access log, and a bind failure as one clear error."""

from __future__ import annotations

import errno
import json
import logging
import socket
import sys
from datetime import datetime

import aiohttp
import pytest
from aiohttp import web

from gateway.logs import ACCESS_LOGGER, JsonFormatter
from gateway.runtime import CannotListen, serving

TRAJECTORY = "traj_0123456789abcdef"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("toolspan.test", logging.ERROR if exc else logging.INFO, __file__, 1, message, args,
                             exc_info)


def test_json_lines_hold_time_level_logger_and_message() -> None:
    line = JsonFormatter().format(record("listening on %s", "http://127.0.0.1:8080/v1"))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry.keys() == {"time", "level", "logger", "message"}
    assert (entry["level"], entry["logger"], entry["message"]) == ("info", "toolspan.test",
                                                                   "listening on http://127.0.0.1:8080/v1")
    assert datetime.fromisoformat(entry["time"]).utcoffset() is not None  # ISO 8601, with its zone


def test_json_lines_carry_the_exception_text() -> None:
    line = JsonFormatter().format(record("tool failed", exc=True))
    assert "\n" not in line  # the traceback's line breaks are escaped: one object, one line
    entry = json.loads(line)
    assert entry["level"] == "error"
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith("ValueError: boom")


async def stamped(request: web.Request) -> web.Response:
    """A handler that sets the ids the gateway's app sets on every response."""
    return web.Response(text="hello", headers={"X-Trajectory-Id": TRAJECTORY, "X-Trace-Id": TRACE})


def tiny_app() -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stamped)
    return app


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    return caplog


async def request_through(access_log: bool) -> None:
    async with (serving(tiny_app(), "127.0.0.1", 0, access_log=access_log) as url,
                aiohttp.ClientSession() as http,
                http.post(f"{url}/v1/chat/completions?x=1", data=b"{}") as response):
        assert await response.text() == "hello"
    # leaving `serving` waits for the handler, which logs once the response is sent


async def test_the_access_log_has_one_line_per_request(access: pytest.LogCaptureFixture) -> None:
    await request_through(access_log=True)
    [line] = [r for r in access.records if r.name == ACCESS_LOGGER]
    assert line.levelno == logging.INFO
    fields = line.__dict__["fields"]  # what a JSON line shows as values
    assert {k: fields[k] for k in ("method", "path", "status", "trajectory_id", "trace_id")} == {
        "method": "POST", "path": "/v1/chat/completions?x=1", "status": 200, "trajectory_id": TRAJECTORY,
        "trace_id": TRACE}
    assert fields["bytes"] > len("hello")  # what went on the wire, headers included
    assert fields["duration_ms"] >= 0
    assert line.getMessage() == (f'127.0.0.1 "POST /v1/chat/completions?x=1 HTTP/1.1" 200 {fields["bytes"]} '
                                 f'{fields["duration_ms"]:.1f}ms trajectory={TRAJECTORY} trace={TRACE}')
    assert json.loads(JsonFormatter().format(line))["status"] == 200


async def test_no_access_log_when_it_is_off(access: pytest.LogCaptureFixture) -> None:
    await request_through(access_log=False)
    assert [r for r in access.records if r.name == ACCESS_LOGGER] == []


async def test_a_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CannotListen) as caught:
            async with serving(tiny_app(), "127.0.0.1", port):
                pytest.fail("listening on a port that is taken")
    assert str(caught.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize(("host", "error", "message"), [
    ("::1", OSError(errno.EADDRINUSE, "error while attempting to bind on address ('::1', 80): address already in use"),
     "cannot listen on [::1]:80: Address already in use"),
    ("no.such.host", socket.gaierror(-2, "Name or service not known"),
     "cannot listen on no.such.host:80: Name or service not known"),
], ids=["ipv6", "unknown-host"])
def test_the_bind_error_names_the_address_and_the_reason(host: str, error: OSError, message: str) -> None:
    assert str(CannotListen(host, 80, error)) == message
