"""Logging for `toolspan serve`: the level and format the operator picks, and the access log.

Everything goes to stderr through the standard `logging` module. The text format is the usual
`time LEVEL logger: message`; the JSON format is one object per line (time, level, logger,
message, and the exception when there is one), for log pipelines that parse it.

Both formats escape what a caller or a provider could have put in a line (a path, an error text):
every control character in the message and in each field becomes a visible escape
(gateway.escaping), so no argument can start a line of its own or rewrite one on a terminal. A
traceback keeps its line breaks, and only those. The access log masks the values of query
parameters that carry credentials.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, ClassVar

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from gateway.escaping import visible, visible_lines
from gateway.headers import TRACE_HEADER, TRAJECTORY_HEADER, SecretNames, secret_names
from gateway.settings import REDACT_KEYS

ACCESS_LOGGER = "toolspan.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "[REDACTED]"  # the marker the argument masking on spans writes (telemetry.arguments)
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message` on one line, whatever the message's arguments hold; then the
    traceback or stack, if any, with its own line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))

    def formatException(self, ei: ExcInfo) -> str:
        return visible_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return visible_lines(super().formatStack(stack_info))


class JsonFormatter(logging.Formatter):
    """One JSON object per record. A record's `fields` (a dict given as `extra={"fields": ...}`)
    are added as values (strings escaped), so an access log line keeps its status, duration ..."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": visible(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            # JSON escapes the C0 controls itself, not DEL, C1 or the bidi controls: all go the same way.
            entry.update({k: visible(v) if isinstance(v, str) else v for k, v in fields.items()})
        if record.exc_info:
            entry["exception"] = visible_lines(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = visible_lines(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """The root logger writes to stderr at `level`, as text or JSON; called once per process."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
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


class AccessLogger(AbstractAccessLogger):
    """One INFO line per request: client, request line, status, bytes sent (headers included, as
    aiohttp counts them), duration, and the trajectory and trace ids the response carries ("-"
    where there is none):

        127.0.0.1 "POST /v1/chat/completions HTTP/1.1" 200 731 12.4ms trajectory=traj_… trace=4bf9…

    The request line's credential parameters are masked (`redacted_target`), by the default redact
    list here; `access_logger` makes the class for another list.
    """

    secret_parameter: ClassVar[SecretNames] = secret_names(REDACT_KEYS)

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        fields = {
            "remote": request.remote or "-",
            "method": request.method,
            "path": redacted_target(request.path_qs, self.secret_parameter),
            "protocol": f"HTTP/{request.version.major}.{request.version.minor}",
            "status": response.status,
            "bytes": response.body_length,
            "duration_ms": round(time * 1000, 1),
            "trajectory_id": response.headers.get(TRAJECTORY_HEADER, "-"),
            "trace_id": response.headers.get(TRACE_HEADER, "-"),
        }
        self.logger.info('%(remote)s "%(method)s %(path)s %(protocol)s" %(status)d %(bytes)d %(duration_ms).1fms '
                         "trajectory=%(trajectory_id)s trace=%(trace_id)s", fields, extra={"fields": fields})

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
