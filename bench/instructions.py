"""Instructions per request, counted by callgrind: a figure that does not move with the machine.

bench/proxy.py measures what a request costs in CPU time, which on a shared machine moves with
everything else the machine does (its rounds and medians deal with that; a difference of 10 us
between two targets still takes many rounds to see). The instructions a request executes do not
move: this runs bench/proxy.py's targets, each its own process, under valgrind's callgrind (all
threads counted, one at a time), loads each with wrk at 10 connections, and divides the instructions
executed during the load (counters zeroed before it, dumped after it: `callgrind_control`) by the
requests wrk got answered. The upstream runs outside valgrind. Python's hash seed is fixed, so
runs repeat closely: within 3% a target for runs of the plain Chat scenario (the store aside: its
batches hold what arrives in 0.2 s, fewer requests the slower the run), within 2.5% for the 30 KB
conversation (four runs of Responses' toolspan-notel: 1,797 to 1,825 thousand).

Targets: floor, floor-otel, toolspan-notel, toolspan-nostore, toolspan (as in bench/proxy.py),
and toolspan-spansoff, the gateway with telemetry on and tracing off (OTEL_SDK_DISABLED: metrics and
trace context only), so that the gateway's telemetry splits into its metrics and the trace context
it passes on (spansoff - notel), its spans (nostore - spansoff) and the trajectory store
(toolspan - nostore); and its spans and metrics (nostore - notel) compare with what the
OpenTelemetry SDK and prometheus_client alone add to the floor for the same spans and updates
(floor-otel - floor), a ratio whose two differences move too much in CPU time to be read from a
few of bench/proxy.py's rounds.

What it does not show: the kernel's work (callgrind counts the process's own instructions, not its
system calls), time spent waiting (a thread waiting for the GIL or the disk costs no instructions),
and what an instruction costs: orjson reading and writing 30 KB does far more in a microsecond than
Python's bookkeeping, so a ratio to the floor is higher in instructions than in CPU time there.
Under valgrind a target runs some 30 times slower, so the trajectory store, which writes what
arrives within 0.2 s in one transaction, writes smaller batches than at full speed (the requests a
second each target answered are printed): its figure here is higher than under real load.

    python bench/instructions.py [--scenarios plain,30kb,responses-plain,responses-30kb] [--seconds 10]
    python bench/instructions.py --flat 60 [--scenarios ...] [--targets ...]

`--flat SECONDS` asks instead whether a target's cost rises over a run: one process loaded that
long, the instructions per request of its last 10 seconds against its first 10.

Any of bench/proxy.py's scenarios may be named; with a tool round and its API's plain request, the
tool round's instructions are also given as a multiple of the plain request's.

Needs valgrind (Debian package `valgrind`, installed by the bench when missing and run as root)
and wrk (as bench/proxy.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from proxy import (
    CHAT,
    DEFAULTS,
    ROOT,
    Scenario,
    _chosen,
    _free_port,
    _need_wrk,
    _start,
    _start_defaults,
    _wait_ready,
    check,
    load,
    need_program,
)

TARGETS = ("floor", "floor-otel", "toolspan-notel", "toolspan-spansoff", "toolspan-nostore", "toolspan", DEFAULTS)
FLAT_WINDOW = 10  # seconds counted at each end of a --flat run
READY_SECONDS = 300.0  # a gateway starting under valgrind takes a minute or more on a busy machine


def _served_as(target: str) -> str:
    """What bench/proxy.py serves for `target` (toolspan-spansoff is toolspan, with OTEL_SDK_DISABLED),
    and so what a client sends it."""
    return "toolspan" if target == "toolspan-spansoff" else target


def _under_callgrind(target: str, port: int, upstream: str, folder: Path) -> subprocess.Popen[bytes]:
    """`target` served by bench/proxy.py (serve-defaults: `toolspan serve`, as bench/proxy.py starts
    it) under callgrind, writing its counts into `folder` (its own)."""
    callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder / target}.out", "--dump-instr=no"]
    if target == DEFAULTS:
        return _start_defaults(port, upstream, folder, callgrind)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0",
           "TOOLSPAN_TRAJECTORY_STORE_PATH": str(folder / f"{target}.sqlite3")}
    if target == "toolspan-spansoff":
        env["OTEL_SDK_DISABLED"] = "true"
    args = [*callgrind, sys.executable, str(ROOT / "bench" / "proxy.py"), "--serve", _served_as(target),
            "--port", str(port), "--upstream", upstream]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _instructions(dump: Path) -> int:
    """The instructions a callgrind dump counts (all threads): its `totals:` line, the sum of what the
    dump holds. Not `summary:`: in the first dump after `callgrind_control -z` it can fall short
    of the totals (by 4% in one check with valgrind 3.19)."""
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals")


def _control(option: str, pid: int) -> None:
    """`callgrind_control option pid`, which exits 0 even when it reached no callgrind: its "OK." is
    the only sign that it did."""
    done = subprocess.run(["callgrind_control", option, str(pid)], capture_output=True, text=True, check=False)
    if "OK." not in done.stdout:
        raise RuntimeError(f"callgrind_control {option} {pid} did not reach callgrind: {done.stdout}{done.stderr}")


def _stop(process: subprocess.Popen[bytes], seconds: float) -> None:
    process.terminate()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def per_request(target: str, scenario: Scenario, upstream: str, seconds: int, folder: Path) -> tuple[float, float]:
    """Instructions per request of `target` on `scenario` under wrk at 10 connections, and the
    requests a second it answered under callgrind (what the store's batches hold depends on it)."""
    [counted] = windows(target, scenario, upstream, [(seconds, True)], folder)
    return counted


def windows(target: str, scenario: Scenario, upstream: str, plan: Sequence[tuple[int, bool]],
            folder: Path) -> list[tuple[float, float]]:
    """`target` under callgrind loaded by wrk at 10 connections for each (seconds, counted) of
    `plan` in turn, one process throughout; for each counted window, the instructions per request
    and the requests a second (as `per_request`)."""
    port = _free_port()
    own = folder / f"{scenario.option}-{target}"  # each run's dumps apart: callgrind numbers them per file
    own.mkdir()
    process = _under_callgrind(target, port, upstream, own)
    url = f"http://127.0.0.1:{port}/v1{scenario.path}"
    found: list[tuple[float, float]] = []
    try:
        asyncio.run(_wait_ready(f"http://127.0.0.1:{port}/v1{CHAT}", READY_SECONDS))
        sent_as = _served_as(target)
        if (problem := check(url, scenario, sent_as)) is not None:
            raise RuntimeError(f"{scenario.name}, {target}: {problem}")
        load(url, scenario.body(sent_as), 3, 10)  # warmed up past the first requests' one-off work
        for seconds, counted in plan:
            if not counted:
                load(url, scenario.body(sent_as), seconds, 10)
                continue
            dumps = set(own.glob(f"{target}.out*"))
            _control("-z", process.pid)
            run = load(url, scenario.body(sent_as), seconds, 10)
            _control("-d", process.pid)
            [dump] = set(own.glob(f"{target}.out*")) - dumps
            found.append((_instructions(dump) / run.requests, run.requests / run.seconds))
        return found
    finally:
        _stop(process, 120)


def flatness(targets: Sequence[str], scenarios: Sequence[Scenario], upstream: str, seconds: int,
             folder: Path) -> None:
    """Each target loaded for `seconds` in one process: the instructions per request of its last 10
    seconds over its first 10 (bench/proxy.py's flatness bound, in a figure that does not move with
    the machine). Under callgrind a target answers some 30 times fewer requests in that time."""
    for scenario in scenarios:
        for target in targets:
            (first, first_rate), (last, last_rate) = windows(
                target, scenario, upstream, [(FLAT_WINDOW, True), (seconds - 2 * FLAT_WINDOW, False),
                                             (FLAT_WINDOW, True)], folder)
            print(f"{scenario.name}, {target}: {first / 1000:.0f} thousand instructions a request in the first "
                  f"{FLAT_WINDOW} s ({first_rate:.0f}/s), {last / 1000:.0f} in the last ({last_rate:.0f}/s) of "
                  f"{seconds} s: last/first {last / first:.3f}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="plain,30kb,responses-plain,responses-30kb")
    parser.add_argument("--seconds", type=int, default=10,
                        help="length of the counted wrk run (the README's table: 10; compare runs of one length)")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help="comma-separated (default all; the table needs all of them)")
    parser.add_argument("--flat", type=int, metavar="SECONDS",
                        help="instead: each target loaded this long (at least 30), its last 10 s against its first")
    options = parser.parse_args(argv)
    if options.flat is not None and options.flat < 3 * FLAT_WINDOW:
        parser.error(f"--flat: at least {3 * FLAT_WINDOW} seconds")
    targets = options.targets.split(",")
    if unknown := set(targets) - set(TARGETS):
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    _need_wrk()
    need_program("valgrind", "`sudo apt-get install valgrind`")
    scenarios = _chosen(options.scenarios)
    counts: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="toolspan-instructions-") as name:
        folder = Path(name)
        upstream_port = _free_port()
        upstream = _start("upstream", upstream_port)
        try:
            asyncio.run(_wait_ready(f"http://127.0.0.1:{upstream_port}/v1{CHAT}"))
            if options.flat is not None:
                flatness(targets, scenarios, f"http://127.0.0.1:{upstream_port}/v1", options.flat, folder)
                return
            for scenario in scenarios:
                counts[scenario.option] = {}
                for target in targets:
                    found, rate = per_request(target, scenario, f"http://127.0.0.1:{upstream_port}/v1",
                                              options.seconds, folder)
                    counts[scenario.option][target] = found
                    print(f"{scenario.name}, {target}: {found / 1000:.0f} thousand instructions a request "
                          f"({rate:.0f} requests a second under callgrind)", flush=True)
        finally:
            _stop(upstream, 30)
    if set(targets) == set(TARGETS):
        report(counts, scenarios)


def report(counts: dict[str, dict[str, float]], scenarios: Sequence[Scenario]) -> None:
    print("\nThousands of instructions a request (callgrind, all threads, wrk at 10 connections):\n")
    print("| scenario | " + " | ".join(TARGETS) + " | toolspan ÷ floor | serve-defaults ÷ floor "
          "| serve-defaults ÷ toolspan | telemetry's share "
          "| metrics and trace context | spans | the store | spans and metrics ÷ the SDK's |")
    print("|---|" + "---:|" * (len(TARGETS) + 8))
    for scenario in scenarios:
        found = counts[scenario.option]
        toolspan, notel = found["toolspan"], found["toolspan-notel"]
        parts = (found["toolspan-spansoff"] - notel, found["toolspan-nostore"] - found["toolspan-spansoff"],
                 toolspan - found["toolspan-nostore"])
        sdk_cell = ""  # floor-otel makes one provider call: only a plain request's compares with it
        if scenario.kind == "plain":
            ours, sdk = found["toolspan-nostore"] - notel, found["floor-otel"] - found["floor"]
            sdk_cell = f"{ours / sdk:.2f} ({ours / 1000:.0f} / {sdk / 1000:.0f})"
        print(f"| {scenario.name} | " + " | ".join(f"{found[t] / 1000:.0f}" for t in TARGETS)
              + f" | {toolspan / found['floor']:.2f} | {found[DEFAULTS] / found['floor']:.2f}"
              + f" | {found[DEFAULTS] / toolspan:.2f} | {(toolspan - notel) / toolspan:.0%} | "
              + " | ".join(f"{part / 1000:.0f} ({part / toolspan:.0%})" for part in parts) + f" | {sdk_cell} |")
    for scenario in scenarios:
        if scenario.kind == "tool" and scenario.plain in counts:
            ratio = counts[scenario.option]["toolspan"] / counts[scenario.plain]["toolspan"]
            print(f"\n{scenario.name}: toolspan's instructions {ratio:.2f} times a plain request's "
                  "(the target of issue 14, in CPU time: <= 2.2)")
    print("\nShares are of toolspan's instructions. The bounds (in CPU time, bench/proxy.py): serve-defaults ÷ floor "
          "<= 1.8 and ÷ toolspan 0.9 to 1.1, the store <= 15%, telemetry without the store <= 20%, a plain "
          "request's spans and metrics <= 0.5 of the SDK's.")


if __name__ == "__main__":
    main()
