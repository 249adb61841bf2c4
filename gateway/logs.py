"""Logging for `toolspan serve`: the level and format the operator picks, and the access log.

Everything goes to stderr through the standard `logging` module. The text format is the usual
`time LEVEL logger: message`; the JSON format is one object per line (time, level, logger,
message, and the exception when there is one), for log pipelines that parse it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from gateway.headers import TRACE_HEADER, TRAJECTORY_HEADER

ACCESS_LOGGER = "toolspan.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record. A record's `fields` (a dict given as `extra={"fields": ...}`)
    are added as they are, so an access log line keeps its status, duration ... as values."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """The root logger writes to stderr at `level`, as text or JSON; called once per process."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # The MCP SDK says at INFO what the gateway reports itself (each session opened and closed, its
    # manager started), and its HTTP client logs every request with its whole URL (an MCP server's
    # URL may hold its key): their warnings and errors show, their chatter only when debugging.
    quiet = logging.NOTSET if level.lower() == "debug" else logging.WARNING
    for chatty in ("mcp", "httpx", "httpx2"):
        logging.getLogger(chatty).setLevel(quiet)


class AccessLogger(AbstractAccessLogger):
    """One INFO line per request: client, request line, status, bytes sent (headers included, as
    aiohttp counts them), duration, and the trajectory and trace ids the response carries ("-"
    where there is none):

        127.0.0.1 "POST /v1/chat/completions HTTP/1.1" 200 731 12.4ms trajectory=traj_… trace=4bf9…
    """

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        fields = {
            "remote": request.remote or "-",
            "method": request.method,
            "path": request.path_qs,
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
