"""CPU per request of the gateway process, under load from `wrk` (a C load generator: Debian
package `wrk`), beside another checkout's gateway in the same run.

bench/proxy.py drives its load from Python in its own process, which saturates before the
gateway does, so its throughput figures also measure the load generator. Here the load comes
from wrk, and what is reported is the gateway process's own CPU time (utime + stime from
/proc/PID/stat) divided by the requests it answered: the steadiest figure on a shared machine.

In one run: the built-in fast upstream, toolspan from this checkout and, with --compare DIR,
toolspan from the checkout at DIR (e.g. a `git worktree` of an earlier commit), each in its own
process (started by bench/proxy.py --serve, on the event loop `toolspan serve` uses). Each round
gives each gateway a warm-up and a measured wrk run, the two taking turns which goes first; the
figures are medians over rounds.

    python bench/cpu.py [--compare DIR] [--api chat|responses] [--rounds 5] [--seconds 10]
                        [--connections 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from proxy import ROOT, _check_imports, _free_port, _start, _wait_ready

TICKS = os.sysconf("SC_CLK_TCK")
BODIES = {"chat": ("chat/completions", {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}),
          "responses": ("responses", {"model": "bench", "input": "hello"})}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def wrk(url: str, body: dict[str, object], seconds: int, connections: int) -> int:
    """Requests answered in one wrk run (non-2xx answers abort the bench: they are not what is measured)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                     f"wrk.body = {json.dumps(json.dumps(body))}\n")
    try:
        done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url],
                              capture_output=True, text=True, check=True)
    finally:
        os.unlink(script.name)
    if "Non-2xx" in done.stdout:
        raise RuntimeError(f"{url} answered with errors:\n{done.stdout}")
    found = re.search(r"(\d+) requests in", done.stdout)
    if found is None:
        raise RuntimeError(f"wrk printed no request count:\n{done.stdout}{done.stderr}")
    return int(found.group(1))


def measure(pid: int, url: str, body: dict[str, object], seconds: int, connections: int) -> float:
    """Microseconds of the process's CPU per request, over one wrk run after a short warm-up."""
    wrk(url, body, 2, connections)
    before = cpu_seconds(pid)
    requests = wrk(url, body, seconds, connections)
    return (cpu_seconds(pid) - before) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=Path, help="another checkout, measured as `before`")
    parser.add_argument("--api", choices=sorted(BODIES), default="chat")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=10)
    options = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench/cpu.py needs wrk (apt-get install wrk)")
    checkouts = {"toolspan": ROOT}
    if options.compare is not None:
        print(f"before: {_check_imports(options.compare.resolve())}")
        checkouts["before"] = options.compare.resolve()
    upstream_port = _free_port()
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    processes = [_start("upstream", upstream_port)]
    urls: dict[str, str] = {}
    pids: dict[str, int] = {}
    path, body = BODIES[options.api]
    try:
        for name, checkout in checkouts.items():
            port = _free_port()
            process = _start("toolspan", port, upstream, checkout)
            processes.append(process)
            urls[name], pids[name] = f"http://127.0.0.1:{port}/v1/{path}", process.pid
        for url in [f"{upstream}/{path}", *urls.values()]:
            asyncio.run(_wait_ready(url.rsplit("/v1/", 1)[0] + "/v1/chat/completions"))
        found: dict[str, list[float]] = {name: [] for name in urls}
        names = list(urls)
        for round_ in range(options.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                found[name].append(measure(pids[name], urls[name], body, options.seconds, options.connections))
            print(f"round {round_ + 1}: " + ", ".join(f"{n} {found[n][-1]:.1f} µs" for n in names), flush=True)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)
    medians = {name: statistics.median(values) for name, values in found.items()}
    print(f"\nCPU per request ({options.api}, wrk -c{options.connections}, medians of {options.rounds} rounds): "
          + ", ".join(f"{name} {value:.1f} µs" for name, value in medians.items()))
    if "before" in medians:
        ratios = [now / then for now, then in zip(found["toolspan"], found["before"], strict=True)]
        print(f"toolspan/before: {statistics.median(ratios):.3f} (per round: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
