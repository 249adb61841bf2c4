"""Logging for `toolspan serve`: the level and format the operator picks, and the access log.

Everything goes to stderr through the standard `logging` module. The text format is the usual
`time LEVEL logger: message`; the JSON format is one object per line (time, level, logger,
message, and the exception when there is one), for log pipelines that parse it.

Both formats escape what a caller or a provider could have put in a line (a path, an error text):
every control character in the message and in each field becomes a visible escape
(gateway.wire.escaping), so no argument can start a line of its own or rewrite one on a terminal. A
traceback keeps its line breaks, and only those. The access log masks the values of query
parameters that carry credentials.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from time import time_ns
from types import TracebackType
from typing import Any, ClassVar

from aiohttp import HttpVersion10, HttpVersion11
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from gateway.settings.model import REDACT_KEYS
from gateway.wire.escaping import visible, visible_lines
from gateway.wire.headers import TRACE_HEADER, TRAJECTORY_HEADER, SecretNames, secret_names

ACCESS_LOGGER = "toolspan.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LINE = ('%(remote)s "%(method)s %(path)s %(protocol)s" %(status)d %(bytes)d %(duration_ms).1fms '
               "trajectory=%(trajectory_id)s trace=%(trace_id)s")


def access_line(fields: Mapping[str, Any]) -> str:
    """`ACCESS_LINE % fields`, the same text (tests/runtime/test_logs.py checks it), written as an f-string,
    which runs in fewer instructions than the %-format."""
    return (f'{fields["remote"]} "{fields["method"]} {fields["path"]} {fields["protocol"]}" {fields["status"]} '
            f'{fields["bytes"]} {fields["duration_ms"]:.1f}ms trajectory={fields["trajectory_id"]} '
            f'trace={fields["trace_id"]}')


MASK = "[REDACTED]"  # the marker the argument masking on spans writes (telemetry.arguments)
_PROTOCOLS = {version: f"HTTP/{version.major}.{version.minor}" for version in (HttpVersion10, HttpVersion11)}
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def shown(text: str) -> str:
    """`visible(text)`, without its regex scan when no character could need an escape: every one
    it escapes is one `str.isprintable` refuses (categories Cc, Cf, Zl, Zp; tests/runtime/test_logs.py
    checks each code point). The check costs well under the scan."""
    return text if text.isprintable() else visible(text)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message` on one line, whatever the message's arguments hold; then the
    traceback or stack, if any, with its own line breaks.

    The time's text up to the second is made once a second, not once a line (it is the same for
    every line of a busy second). That and `shown` make an access record format markedly faster
    (bench/access_log.py, "formatting")."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)
        self.text_format = fmt  # what `direct_handler` checks: its own copy, not logging's private one
        self._second: tuple[int, str] = (-1, "")  # the last second formatted, and its text

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        return self.time_text(record.created, record.msecs)

    def time_text(self, created: float, msecs: float) -> str:
        """The time of a record made at `created` (`msecs` its milliseconds) as `formatTime` writes
        it with the default formats."""
        second = int(created)  # what localtime() takes of it: the second, rounded down
        if second != self._second[0]:
            self._second = (second, time.strftime(self.default_time_format, self.converter(created)))
        return str(self.default_msec_format) % (self._second[1], msecs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return shown(super().formatMessage(record))

    def formatException(self, ei: ExcInfo) -> str:
        return visible_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return visible_lines(super().formatStack(stack_info))


class JsonFormatter(logging.Formatter):
    """One JSON object per record. A record's `fields` (a dict given as `extra={"fields": ...}`)
    are added as values (strings escaped), so an access log line keeps its status, duration ...

    Made once rather than per line: the encoder (`json.dumps` with options builds one per call)
    and, once a second, the time's text up to the second. That and `shown` for the strings make an
    access record format markedly faster (bench/access_log.py, "formatting")."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)
        self._encoder = json.JSONEncoder(ensure_ascii=False, default=str)
        self._second: tuple[float, str] = (-1.0, "")  # the last second formatted, and its text

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self._iso_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": shown(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            # JSON escapes the C0 controls itself, not DEL, C1 or the bidi controls: all go the same way.
            entry.update({k: shown(v) if isinstance(v, str) else v for k, v in fields.items()})
        if record.exc_info:
            entry["exception"] = visible_lines(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = visible_lines(self.formatStack(record.stack_info))
        return self._encoder.encode(entry)

    def _iso_time(self, created: float) -> str:
        """`datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")`, the same
        text: the microseconds rounded half to even as datetime does, then cut to milliseconds."""
        fraction, second = math.modf(created)
        micros = round(fraction * 1_000_000)
        if micros == 1_000_000:
            second, micros = second + 1, 0
        if second != self._second[0]:
            self._second = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
        return f"{self._second[1]}.{micros // 1000:03d}+00:00"


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """The root logger writes to stderr at `level`, as text or JSON; called once per process, by
    the command line's own (`toolspan serve`, `demo`, `mcp`), never by the library.

    Records leave out the thread's and the process's ids and names, which neither format shows:
    looking them up (a getpid system call among them) was a measurable part of an access line's
    CPU (bench/access_log.py). A process that needs them sets `logging.logThreads` and the like
    back."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # The MCP SDK says at INFO what the gateway reports itself (each session opened and closed, its
    # manager started), and its HTTP client logs every request with its whole URL (an MCP server's
    # URL may hold its key): their warnings and errors show, their chatter only when debugging.
    quiet = logging.NOTSET if level.lower() == "debug" else logging.WARNING
    for chatty in ("mcp", "httpx", "httpx2"):
        logging.getLogger(chatty).setLevel(quiet)


def redacted_target(target: str, secret: SecretNames) -> str:
    """A request target (path and query, as sent) with the value of each credential parameter
    masked: one of QUERY_CREDENTIALS, or a name `secret` holds.
    Names are compared percent-decoded; everything else stays as it was sent."""
    path, _, query = target.partition("?")
    return f"{path}?{secret.without_credentials(query, MASK)}" if query else target


def direct_handler(logger: logging.Logger) -> logging.StreamHandler[Any] | None:
    """The handler an INFO record of `logger` reaches, when that is all the logging module would do
    with it: one plain StreamHandler with the text format `configure_logging` installs, and no
    filter, other handler or record factory on the way (checked through the loggers' public
    attributes, at every line, so a handler added while the gateway runs takes over at once).
    None when anything else could see the record: then it goes through `logger.handle`."""
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return None
    found: logging.Handler | None = None
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters or node.disabled:
            return None
        for handler in node.handlers:
            if handler.level > logging.INFO:
                continue  # it would not emit the record either
            if found is not None:
                return None
            found = handler
        node = node.parent if node.propagate else None
    if type(found) is not logging.StreamHandler or found.filters:
        return None
    formatter = found.formatter
    if (type(formatter) is not TextFormatter or formatter.text_format != TEXT_FORMAT or formatter.datefmt
            or not formatter.default_msec_format):
        return None
    return found


class AccessLogger(AbstractAccessLogger):
    """One INFO line per request: client, request line, status, bytes sent (headers included, as
    aiohttp counts them), duration, and the trajectory and trace ids the response carries ("-"
    where there is none):

        127.0.0.1 "POST /v1/chat/completions HTTP/1.1" 200 731 12.4ms trajectory=traj_… trace=4bf9…

    The request line's credential parameters are masked (`redacted_target`), by the default redact
    list here; `access_logger` makes the class for another list.

    Where the line goes only to `configure_logging`'s own text handler (`direct_handler`: what
    `toolspan serve` sets up), it is written there as that handler would write it, the same text,
    without the record the logging module would make and pass along its loggers, filters and
    handler (`_write`), which takes a line much fewer instructions and much less CPU
    (`python bench/access_log.py --before bce4848`, text).
    Anywhere else the record goes to the logger's handlers as `logger.info` would send it, the same
    record (made by the record factory in force, with `fields` as an extra), save the stack walk
    that finds where it was logged from: that is always here, and this frame says so at a fraction
    of the cost.
    """

    secret_parameter: ClassVar[SecretNames] = secret_names(REDACT_KEYS)

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        logger = self.logger
        if not logger.isEnabledFor(logging.INFO):  # aiohttp asks `enabled` once a connection
            return
        version = request.version
        fields = {
            "remote": request.remote or "-",
            "method": request.method,
            "path": redacted_target(request.path_qs, self.secret_parameter),
            "protocol": _PROTOCOLS.get(version) or f"HTTP/{version.major}.{version.minor}",
            "status": response.status,
            "bytes": response.body_length,
            "duration_ms": round(time * 1000, 1),
            "trajectory_id": response.headers.get(TRAJECTORY_HEADER, "-"),
            "trace_id": response.headers.get(TRACE_HEADER, "-"),
        }
        handler = direct_handler(logger)
        if handler is not None:
            self._write(handler, fields)
        else:
            logger.handle(self._record(fields))

    def _record(self, fields: dict[str, Any]) -> logging.LogRecord:
        logger = self.logger
        here = sys._getframe(1)  # what Logger.findCaller would find: the line of `log` that called this
        return logger.makeRecord(logger.name, logging.INFO, here.f_code.co_filename, here.f_lineno, ACCESS_LINE,
                                 (fields,), None, here.f_code.co_name, {"fields": fields})

    def _write(self, handler: logging.StreamHandler[Any], fields: dict[str, Any]) -> None:
        """The line `handler` would write for the record (Formatter.format, then StreamHandler.emit,
        under the handler's lock), made from the fields at once."""
        formatter = handler.formatter
        assert isinstance(formatter, TextFormatter)  # direct_handler said so
        now = time_ns()  # as LogRecord takes the time (3.12 on), its milliseconds too
        asctime = formatter.time_text(now / 1e9, (now % 1_000_000_000) // 1_000_000 + 0.0)
        line = shown(f"{asctime} {logging.getLevelName(logging.INFO)} {self.logger.name}: {access_line(fields)}")
        handler.acquire()
        try:
            stream = handler.stream
            stream.write(line + handler.terminator)
            if stream and hasattr(stream, "flush"):  # as StreamHandler.flush, whose lock this holds already
                stream.flush()
        except RecursionError:  # as StreamHandler.emit
            raise
        except Exception:
            handler.handleError(self._record(fields))
        finally:
            handler.release()

    @property
    def enabled(self) -> bool:
        """Nothing is formatted when the level hides it (`toolspan demo`, the bench, the tests)."""
        return self.logger.isEnabledFor(logging.INFO)


def access_logger(redact_keys: Sequence[str]) -> type[AccessLogger]:
    """The access logger class for aiohttp to make (it calls `cls(logger, log_format)` itself),
    masking the query parameters `redact_keys` names as well as QUERY_CREDENTIALS."""
    secret = secret_names(tuple(redact_keys))

    class BoundAccessLogger(AccessLogger):
        secret_parameter = secret

    return BoundAccessLogger
