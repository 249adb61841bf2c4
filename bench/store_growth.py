"""What writing a plain request's rows into the trajectory store costs as the store grows.

A plain request leaves two spans the store keeps: its `chat` turn and its SERVER span. This writes
them through `telemetry.records.write` as the store's writer does (batches of --batch requests, one
transaction each, with the age pruning every batch runs), into a new file, up to --requests
requests, and prints the CPU per request of the batches in each tenth of the run (checkpoints of
the write-ahead log included, as they fall).

Trajectory ids: as the gateway mints them (time first, `gateway.caller.request_ids`), or with
--named-ids as random as a caller may name them (each request its own trajectory either way).

    python bench/store_growth.py [--requests 100000] [--batch 400] [--named-ids]
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.trace import SpanKind

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.caller import request_ids
from telemetry import names
from telemetry.records import SpanRecord, connect, prune, write


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=400, help="requests per transaction")
    parser.add_argument("--named-ids", action="store_true", help="random trajectory ids, as a caller may name them")
    options = parser.parse_args()
    tenth = max(options.requests // 10, options.batch)
    with tempfile.TemporaryDirectory(prefix="toolspan-store-growth-") as folder:
        db = connect(str(Path(folder, "store.sqlite3")))
        written, cpu, counted = 0, 0.0, 0
        print(f"{options.requests} plain requests in batches of {options.batch}, "
              f"{'random (caller-named)' if options.named_ids else 'gateway-minted'} trajectory ids")
        while written < options.requests:
            batch = []
            for _ in range(options.batch):
                trajectory = secrets.token_hex(16) if options.named_ids else request_ids({})[0]
                batch += plain_request(trajectory, time.time_ns())
            started = time.process_time()
            db.execute("BEGIN IMMEDIATE")
            write(db, batch)
            prune(db, before=time.time() - 30 * 86400)
            db.execute("COMMIT")
            cpu += time.process_time() - started
            written += options.batch
            counted += options.batch
            if written % tenth < options.batch or written >= options.requests:
                print(f"  {written:>9,} requests stored: {cpu / counted * 1e6:6.1f} us per request")
                cpu, counted = 0.0, 0
        size = sum(path.stat().st_size for path in Path(folder).glob("store.sqlite3*"))
        print(f"  file and write-ahead log: {size / written:.0f} bytes per request")
        db.close()


if __name__ == "__main__":
    main()
