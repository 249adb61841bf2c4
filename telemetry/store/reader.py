"""The trajectory store's file as the page (`GET /ui`) reads it: `telemetry.store.report`'s questions,
over one gateway key's trajectories (`key`) or every one (None), each on a read-only connection
of its own (the store's writer thread keeps its own; in WAL mode readers never wait for it). A
file not written yet raises sqlite3.Error, as a broken one does."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

from telemetry.store import compare, recorded, report

T = TypeVar("T")


class StoreReader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self, question: Callable[[sqlite3.Connection], T]) -> T:
        with closing(report.open_readonly(str(self.path))) as db:
            return question(db)

    def report(self, key: str | None) -> dict[str, Any]:
        return self._read(lambda db: report.report(db, key=key))

    def compared(self, by: str, key: str | None) -> dict[str, Any]:
        return self._read(lambda db: compare.compared(db, by, key=key))

    def rejections_over_time(self, bucket_seconds: float, key: str | None) -> list[dict[str, Any]]:
        return self._read(lambda db: report.rejections_over_time(db, bucket_seconds=bucket_seconds, key=key))

    def list_trajectories(self, *, tool: str | None, outcome: str | None, since: float | None,
                          model: str | None, limit: int, key: str | None) -> list[dict[str, Any]]:
        return self._read(lambda db: report.list_trajectories(db, tool=tool, outcome=outcome, since=since,
                                                              model=model, limit=limit, key=key))

    def trajectory(self, trajectory_id: str, key: str | None, *, offset: int = 0,
                   limit: int | None = None) -> dict[str, Any] | None:
        return self._read(lambda db: report.trajectory(db, trajectory_id, key, offset=offset, limit=limit))

    def recorded_calls(self, *, key: str | None, gateway_only: bool, limit: int) -> list[dict[str, Any]]:
        return self._read(lambda db: list(recorded.recorded_calls(db, key=key, gateway_only=gateway_only,
                                                                  limit=limit)))
