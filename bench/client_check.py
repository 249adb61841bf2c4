"""What the parse step for client tool calls (gateway.client_tools.check) costs: CPU per call for the 19
client calls of bench/proxy.py's 30 KB conversation, checked against the request's own `tools`.

Each iteration is one request's work: a ClientTools made from the request's tools, then every one
of its 19 calls checked. Measured with time.process_time over --iterations iterations, best of
--repeats, per call (the ClientTools' making included, spread over the 19):
  warm      the app's SchemaCache already holds both schemas (every request after the first);
  cold      a new SchemaCache each iteration: both schemas compiled (the first request, or after
            the cache dropped them);
  rejected  warm, every call with its argument renamed (`file_path`), so each is rejected with the
            did-you-mean diagnostic.
For Chat (LONG_CHAT) and Responses (LONG_RESPONSES) tools alike: the same schemas.

Three runs here (2 cores shared with another benchmark, CPython 3.11, jsonschema 4.26, defaults):
warm 26-36 µs, cold 143-217 µs, rejected 58-77 µs per call; about 17 µs of a warm call is
jsonschema's iter_errors, the rest read_arguments and the names. A request checks the calls of the
answer it gets (one or two), not those of its history.

    python bench/client_check.py [--iterations 500] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ modules, as when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's gateway
from proxy import CALLS, LONG_CHAT, LONG_RESPONSES

from gateway.client_tools.check import ClientTools, SchemaCache

Call = tuple[str, str]  # (tool name, arguments as the model sent them)


def chat_calls(request: dict[str, Any]) -> list[Call]:
    return [(call["function"]["name"], call["function"]["arguments"])
            for message in request["messages"] for call in message.get("tool_calls") or ()]


def renamed(calls: list[Call]) -> list[Call]:
    """The same calls with `path` sent as `file_path`, and grep's `pattern` as `query`."""
    def rename(arguments: str) -> str:
        values = json.loads(arguments)
        names = {"path": "file_path", "pattern": "query"}
        return json.dumps({names.get(key, key): value for key, value in values.items()})
    return [(name, rename(arguments)) for name, arguments in calls]


def per_call(tools: list[dict[str, Any]], calls: list[Call], cold: bool, iterations: int, repeats: int) -> float:
    """Best-of-`repeats` CPU microseconds per call."""
    cache = SchemaCache()
    ClientTools(tools, cache).check(*calls[0])  # warm: the schemas compiled before the clock starts
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.process_time()
        for _ in range(iterations):
            client = ClientTools(tools, SchemaCache() if cold else cache)
            for name, arguments in calls:
                client.check(name, arguments)
        best = min(best, time.process_time() - start)
    return best / (iterations * len(calls)) * 1e6


def expect(tools: list[dict[str, Any]], calls: list[Call], outcome: str) -> None:
    """Every call comes out as the scenario says, or the bench measures the wrong path."""
    client = ClientTools(tools, SchemaCache())
    got = {client.check(name, arguments).outcome for name, arguments in calls}
    if got != {outcome}:
        raise SystemExit(f"expected every call {outcome}, got {sorted(got)}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    calls = chat_calls(LONG_CHAT)
    assert len(calls) == CALLS, len(calls)
    wrong = renamed(calls)
    print(f"{CALLS} client calls of the 30 KB conversation, CPU per call (best of {args.repeats} x "
          f"{args.iterations} requests)")
    for api, tools in (("Chat", LONG_CHAT["tools"]), ("Responses", LONG_RESPONSES["tools"])):
        expect(tools, calls, "ok")
        expect(tools, wrong, "rejected")
        warm = per_call(tools, calls, False, args.iterations, args.repeats)
        cold = per_call(tools, calls, True, args.iterations, args.repeats)
        bad = per_call(tools, wrong, False, args.iterations, args.repeats)
        print(f"  {api:<9}  warm {warm:6.1f} µs   cold {cold:6.1f} µs   rejected {bad:6.1f} µs   "
              f"(per request of {CALLS} calls, warm: {warm * CALLS:,.0f} µs)")


if __name__ == "__main__":
    main()
