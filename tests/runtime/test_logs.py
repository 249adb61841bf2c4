"""Logging for operators (gateway.runtime.logs): the text and JSON formatters (what a caller or a
provider put in a line escaped) and the access log (credentials in the query masked)."""

from __future__ import annotations

import inspect
import io
import json
import logging
import sys
import time
from datetime import UTC, datetime

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

import gateway.runtime.logs
from gateway.runtime.logs import (
    ACCESS_LINE,
    ACCESS_LOGGER,
    TEXT_FORMAT,
    AccessLogger,
    JsonFormatter,
    TextFormatter,
    access_line,
    access_logger,
    direct_handler,
    redacted_target,
    shown,
)
from gateway.runtime.process import serving
from gateway.settings.model import REDACT_KEYS
from gateway.wire.escaping import visible
from gateway.wire.headers import secret_names
from tests.conftest import installed_formatter
from tests.runtime.conftest import TRACE, TRAJECTORY, tiny_app


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


FORGING = "/v1/x\r\n2030-01-01 INFO toolspan: fine\x1b[2J\x7f\x9b\u202e\u2028"  # what a caller may put in a path
SHOWN = "/v1/x\\r\\n2030-01-01 INFO toolspan: fine\\u001b[2J\\u007f\\u009b\\u202e\\u2028"


def failed_record(message: str) -> logging.LogRecord:
    """An ERROR record with the traceback of a ValueError whose message is `message`."""
    try:
        raise ValueError(message)
    except ValueError:
        return logging.LogRecord("toolspan.test", logging.ERROR, __file__, 1, "failed on %s", (FORGING,),
                                 sys.exc_info())


def test_text_lines_show_control_characters_as_escapes() -> None:
    line = installed_formatter("text").format(record("GET %s: %s", FORGING, "done"))
    assert line.endswith(f"INFO toolspan.test: GET {SHOWN}: done")
    assert "\n" not in line


def test_a_traceback_keeps_its_own_line_breaks_and_nothing_else() -> None:
    text = installed_formatter("text").format(failed_record("bad \x1b]0;title\x07 input"))
    first, *traceback = text.split("\n")
    assert first.endswith(f"ERROR toolspan.test: failed on {SHOWN}")
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[-1] == "ValueError: bad \\u001b]0;title\\u0007 input"


def test_stack_text_keeps_its_own_line_breaks_and_nothing_else() -> None:
    entry = record("here")
    entry.stack_info = "Stack (most recent call last):\n  File \"x\x1b[2J.py\", line 1"
    assert installed_formatter("text").format(entry).split("\n")[1:] == [
        "Stack (most recent call last):", '  File "x\\u001b[2J.py", line 1']


def test_json_lines_escape_the_message_and_every_string_field() -> None:
    """JSON escapes C0 itself; DEL, C1, the separators and the bidi controls too are escaped, the same way."""
    entry = record("GET %s", FORGING)
    entry.fields = {"path": FORGING, "status": 200}
    line = installed_formatter("json").format(entry)
    assert not any(c in line for c in "\x7f\x9b\u202e\u2028")
    decoded = json.loads(line)
    assert (decoded["message"], decoded["path"], decoded["status"]) == (f"GET {SHOWN}", SHOWN, 200)


def test_json_lines_show_the_tracebacks_control_characters() -> None:
    decoded = json.loads(installed_formatter("json").format(failed_record("bad \x9b input")))
    assert decoded["message"] == f"failed on {SHOWN}"
    assert decoded["exception"].splitlines()[-1] == "ValueError: bad \\u009b input"


def test_the_quick_escape_escapes_every_character_the_full_one_does() -> None:
    """`shown` skips the scan for text `str.isprintable` passes: no character visible() escapes may pass."""
    assert [c for c in map(chr, range(0x110000)) if shown(c) != visible(c)] == []
    assert shown(FORGING) == SHOWN


# Times within one second and across seconds (each formatter keeps the text of its last second),
# and fractions that datetime rounds up to the next second or to the next millisecond.
TIMES = [1764770000.0, 1764770000.0004, 1764770000.9994999, 1764770000.9999996, 1764770001.25, 1764770000.5,
         1764770000.0005, 1764776399.9995, 1.5, 1764770001.0009995]


def test_json_times_are_datetimes_own_text() -> None:
    formatter = JsonFormatter()
    for created in TIMES:
        entry = record("x")
        entry.created = created
        assert json.loads(formatter.format(entry))["time"] == datetime.fromtimestamp(created, UTC).isoformat(
            timespec="milliseconds"), created


def test_text_times_are_the_standard_formatters_text() -> None:
    ours, standard = TextFormatter(TEXT_FORMAT), logging.Formatter(TEXT_FORMAT)
    for created in TIMES:
        entry = record("x")
        entry.created, entry.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert ours.formatTime(entry) == standard.formatTime(entry), created
    dated = TextFormatter(TEXT_FORMAT, "%H:%M"), logging.Formatter(TEXT_FORMAT, "%H:%M")
    assert dated[0].formatTime(entry) == dated[1].formatTime(entry)


@pytest.mark.parametrize(("target", "shown"), [
    ("/v1/models", "/v1/models"),
    ("/v1/models?limit=2&order=asc", "/v1/models?limit=2&order=asc"),
    ("/v1/m?API_KEY=a&Key=b&token=c&sig=d&access_token=e&api-key=f",
     "/v1/m?API_KEY=[REDACTED]&Key=[REDACTED]&token=[REDACTED]&sig=[REDACTED]&access_token=[REDACTED]"
     "&api-key=[REDACTED]"),
    ("/v1/m?api%5Fkey=a&my_password=b&x-secret-id=c&refresh_token=d", "/v1/m?api%5Fkey=[REDACTED]"
     "&my_password=[REDACTED]&x-secret-id=[REDACTED]&refresh_token=[REDACTED]"),  # names decoded; the redact list
    ("/v1/m?keyring=a&monkey=b&token&flag=1", "/v1/m?keyring=a&monkey=b&token&flag=1"),  # not named, no value
], ids=["no-query", "no-credential", "by-name", "by-redact-list", "others"])
def test_credentials_in_the_query_are_masked(target: str, shown: str) -> None:
    assert redacted_target(target, AccessLogger.secret_parameter) == shown


def test_the_access_logger_takes_the_configured_redact_list() -> None:
    bound = access_logger([*REDACT_KEYS, "tenant"])
    assert issubclass(bound, AccessLogger)
    assert redacted_target("/v1/m?tenant-id=a&sig=b", bound.secret_parameter) == (
        "/v1/m?tenant-id=[REDACTED]&sig=[REDACTED]")
    assert redacted_target("/v1/m?tenant-id=a", AccessLogger.secret_parameter) == "/v1/m?tenant-id=a"
    assert access_logger(()).secret_parameter == secret_names(())


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
    # where a format with %(pathname)s, %(lineno)d or %(funcName)s says it was logged from
    assert (line.pathname, line.module, line.funcName) == (gateway.runtime.logs.__file__, "logs", "log")
    source, start = inspect.getsourcelines(AccessLogger.log)
    assert start < line.lineno < start + len(source)


async def test_no_access_log_when_it_is_off(access: pytest.LogCaptureFixture) -> None:
    await request_through(access_log=False)
    assert [r for r in access.records if r.name == ACCESS_LOGGER] == []


def test_no_access_line_once_the_level_hides_it(access: pytest.LogCaptureFixture) -> None:
    """aiohttp asks whether the log is on once a connection: a level raised since still holds."""
    logger = logging.getLogger(ACCESS_LOGGER)
    writer = AccessLogger(logger, "")
    access.set_level(logging.WARNING, logger=ACCESS_LOGGER)
    writer.log(make_mocked_request("GET", "/v1/models"), web.Response(), 0.001)
    assert [r for r in access.records if r.name == ACCESS_LOGGER] == []


def access_writer(stream: io.StringIO, formatter: logging.Formatter | None = None) -> AccessLogger:
    """An access logger whose logger stands apart from the process's (pytest's handlers sit on the
    root), writing to `stream` through a handler as `configure_logging` makes it."""
    logger = logging.Logger(ACCESS_LOGGER)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter or TextFormatter(TEXT_FORMAT))
    logger.addHandler(handler)
    return AccessLogger(logger, "")


def test_a_line_written_directly_is_the_records_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """With only the text handler to reach, the line is written without a record: the same text,
    escapes included, as the record would have given."""
    now = 1764770000_500_000_000  # exact in a float: 3.11's records truncate a fraction (gh-89047)
    monkeypatch.setattr(time, "time", lambda: now / 1e9)  # the record's clock (3.11)
    monkeypatch.setattr(time, "time_ns", lambda: now)  # the record's clock (3.12 on)
    monkeypatch.setattr(gateway.runtime.logs, "time_ns", lambda: now)
    direct, through_record = io.StringIO(), io.StringIO()
    writer, other = access_writer(direct), access_writer(through_record)
    other.logger.addFilter(lambda record: True)  # any filter: the record must be made
    assert direct_handler(writer.logger) is writer.logger.handlers[0]
    assert direct_handler(other.logger) is None
    request = make_mocked_request("POST", "/v1/chat/completions?api_key=secret&x=1")
    response = web.Response(text="ok", headers={"X-Trajectory-Id": "traj_\x1b[2J\u2028", "X-Trace-Id": TRACE})
    for access in (writer, other):
        access.log(request, response, 0.01234)
        access.log(make_mocked_request("GET", "/healthz"), web.Response(status=404), 0.2)
    assert direct.getvalue() == through_record.getvalue()
    first = direct.getvalue().splitlines()[0]
    assert first.startswith(time.strftime("%Y-%m-%d %H:%M:%S,500 INFO toolspan.access: ", time.localtime(now / 1e9)))
    assert first.endswith(' "POST /v1/chat/completions?api_key=[REDACTED]&x=1 HTTP/1.1" 200 '
                          + first.split(" 200 ")[1].split(" ")[0] + " 12.3ms trajectory=traj_\\u001b[2J\\u2028 "
                          f"trace={TRACE}")


@pytest.mark.parametrize("change", ["filter on the logger", "second handler", "json", "record factory",
                                    "formatter with a date format"])
def test_anything_more_than_the_text_handler_gets_the_record(change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = access_writer(io.StringIO(), JsonFormatter() if change == "json" else None)
    if change == "filter on the logger":
        writer.logger.addFilter(lambda record: True)
    elif change == "second handler":
        writer.logger.addHandler(logging.NullHandler())
    elif change == "record factory":
        monkeypatch.setattr(logging, "getLogRecordFactory", lambda: lambda *args, **kwargs: None)
    elif change == "formatter with a date format":
        writer.logger.handlers[0].setFormatter(TextFormatter(TEXT_FORMAT, "%H:%M"))
    assert direct_handler(writer.logger) is None


def test_a_handler_that_would_not_emit_the_line_does_not_count() -> None:
    writer = access_writer(io.StringIO())
    quiet = logging.NullHandler(logging.WARNING)
    writer.logger.addHandler(quiet)
    assert direct_handler(writer.logger) is writer.logger.handlers[0]
    quiet.setLevel(logging.INFO)
    assert direct_handler(writer.logger) is None


@given(st.fixed_dictionaries({
    "remote": st.text(), "method": st.text(), "path": st.text(), "protocol": st.text(), "status": st.integers(),
    "bytes": st.integers(), "duration_ms": st.floats(allow_nan=True, allow_infinity=True).map(lambda x: round(x, 1)),
    "trajectory_id": st.text(), "trace_id": st.text()}))
def test_the_access_line_is_its_format(fields: dict[str, object]) -> None:
    assert access_line(fields) == ACCESS_LINE % fields
