"""What writing a plain request's rows into the trajectory store costs as the store grows.

A plain request leaves two spans the store keeps: its `chat` turn and its SERVER span. This writes
them through `telemetry.store.records.write` as the store's writer does (batches of --batch requests, one
transaction each, with the age pruning every batch runs), into a new file, up to --requests
requests, and prints the CPU per request of the batches in each tenth of the run (checkpoints of
the write-ahead log included, as they fall).

Trajectory ids: as the gateway mints them (time first, `gateway.caller.request_ids`), or with
--named-ids as random as a caller may name them (each request its own trajectory either way).

--layout sets what the same records are written as. `tables` is the store's (the default);
the other two are lower bounds for any layout the store could move to, not stores: `rows`, one
row a span in a single table without an index (the span's fields and attributes as one JSON
value), so that nothing but an append is left of SQLite's work; `log`, a JSON line a span
appended to a file, no SQLite at all (what `/ui` and `toolspan trajectories` read would then have
to be built from it when they read).

    python bench/store_growth.py [--requests 100000] [--batch 400] [--named-ids] [--layout tables|rows|log]
"""

from __future__ import annotations

import argparse
import resource
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from opentelemetry.trace import SpanKind

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.caller import request_ids
from telemetry import names
from telemetry.store.records import prune, write
from telemetry.store.schema import connect
from telemetry.store.span_records import SpanRecord


def plain_request(trajectory_id: str, start_ns: int) -> list[SpanRecord]:
    trace, request, turn = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(8)
    chat = SpanRecord("chat bench", SpanKind.CLIENT, trace, turn, request, start_ns + 100_000, start_ns + 900_000, {
        names.ATTR_OPERATION_NAME: names.OPERATION_CHAT, names.ATTR_PROVIDER_NAME: "openai",
        names.ATTR_REQUEST_MODEL: "bench", names.ATTR_RESPONSE_MODEL: "bench", names.ATTR_REQUEST_STREAM: False,
        names.ATTR_RESPONSE_ID: "chatcmpl-" + secrets.token_hex(12), names.ATTR_FINISH_REASONS: ["stop"],
        names.ATTR_INPUT_TOKENS: 31, names.ATTR_OUTPUT_TOKENS: 1})
    server = SpanRecord("POST /v1/chat/completions", SpanKind.SERVER, trace, request, None, start_ns,
                        start_ns + 1_000_000, {
                            names.ATTR_CONVERSATION_ID: trajectory_id, names.ATTR_HTTP_ROUTE: "/v1/chat/completions",
                            names.ATTR_HTTP_STATUS: 200, names.ATTR_ROUNDS: 1, names.ATTR_ROUND_LIMIT_REACHED: False})
    return [chat, server]


def _fields(record: SpanRecord) -> tuple[object, ...]:
    return (record.name, record.kind.value, record.trace_id, record.span_id, record.parent_span_id, record.start_ns,
            record.end_ns, record.attributes, record.error, record.status_description)


def tables_writer(folder: str) -> Callable[[list[SpanRecord]], None]:
    db = connect(str(Path(folder, "store.sqlite3")))

    def write_batch(batch: list[SpanRecord]) -> None:
        db.execute("BEGIN IMMEDIATE")
        write(db, batch)
        prune(db, before=time.time() - 30 * 86400)
        db.execute("COMMIT")
    return write_batch


def rows_writer(folder: str) -> Callable[[list[SpanRecord]], None]:
    db = connect(str(Path(folder, "store.sqlite3")))  # the store's own settings (WAL, synchronous, cache)
    db.execute("CREATE TABLE spans (trajectory_id TEXT, span_id TEXT, ended REAL, record BLOB)")

    def write_batch(batch: list[SpanRecord]) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO spans VALUES (?, ?, ?, ?)", (
            (r.attributes.get(names.ATTR_CONVERSATION_ID, ""), r.span_id, r.end_ns / 1e9, orjson.dumps(_fields(r)))
            for r in batch))
        db.execute("COMMIT")
    return write_batch


def log_writer(folder: str) -> Callable[[list[SpanRecord]], None]:
    path = Path(folder, "store.jsonl")

    def write_batch(batch: list[SpanRecord]) -> None:
        # A line at a time into the file's buffer: the batch's lines joined first would hold some
        # 400 KB that the allocator gets from the kernel and gives back each batch, 5 us a request.
        with path.open("ab", buffering=2**16) as log:
            for record in batch:
                log.write(orjson.dumps(_fields(record), option=orjson.OPT_APPEND_NEWLINE))
    return write_batch


LAYOUTS = {"tables": tables_writer, "rows": rows_writer, "log": log_writer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=400, help="requests per transaction")
    parser.add_argument("--named-ids", action="store_true", help="random trajectory ids, as a caller may name them")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="tables",
                        help="the store's tables, or a lower bound: one unindexed row a span, or a log file")
    options = parser.parse_args()
    tenth = max(options.requests // 10, options.batch)
    with tempfile.TemporaryDirectory(prefix="toolspan-store-growth-") as folder:
        write_batch = LAYOUTS[options.layout](folder)
        written, cpu, counted, total, kernel = 0, 0.0, 0, 0.0, 0.0
        print(f"{options.requests} plain requests in batches of {options.batch}, "
              f"{'random (caller-named)' if options.named_ids else 'gateway-minted'} trajectory ids, "
              f"layout {options.layout}")
        while written < options.requests:
            batch = []
            for _ in range(options.batch):
                trajectory = secrets.token_hex(16) if options.named_ids else request_ids({})[0]
                batch += plain_request(trajectory, time.time_ns())
            before = resource.getrusage(resource.RUSAGE_SELF)
            write_batch(batch)
            after = resource.getrusage(resource.RUSAGE_SELF)
            spent = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            kernel += after.ru_stime - before.ru_stime
            cpu += spent
            total += spent
            written += options.batch
            counted += options.batch
            if written % tenth < options.batch or written >= options.requests:
                print(f"  {written:>9,} requests stored: {cpu / counted * 1e6:6.1f} us per request")
                cpu, counted = 0.0, 0
        print(f"  the whole run: {total / written * 1e6:.1f} us per request, "
              f"{kernel / written * 1e6:.1f} of them the kernel's")
        size = sum(path.stat().st_size for path in Path(folder).glob("store.*"))
        print(f"  on disk (with any write-ahead log): {size / written:.0f} bytes per request")


if __name__ == "__main__":
    main()
