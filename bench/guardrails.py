"""What the built-in guardrails (issue 59) cost a tool call: CPU per call of ToolExecutor.run_call
for a tool whose result is 1 KiB or 64 KiB of ordinary text (JSON records and prose, no
credential, no marker: every guardrail reads all of it and allows it), with each built-in alone
and with the five together, against the same executor without guardrails, in one run.

Targets, each an executor over the same registry (one tool, `fetch(url, path, query)`, whose body
returns the prepared text), built as the gateway builds it, by Guardrails.from_settings:
  none          ToolExecutor(registry): executor.guardrails is None, the baseline;
  unconfigured  the settings of every built-in given (hosts, values, injection) but no guardrail
                named: from_settings returns None, so a call spends nothing on guardrails;
  secrets, result_size, denied_values, url_hosts, injection
                `guardrails = [name]`;
  all           the five, in BUILTIN_NAMES order.
Before measuring, each target's call is checked: status ok and the text unchanged (every
guardrail allowed it), and its chain holds the guardrails it names.

Method (bench/tool_pipeline.py's): every repeat runs every target, one call at a time, --calls
calls each, their order rotating; process CPU time (all threads) per call. Reported: the median
per call, and the medians over the repeats of what a target adds to `none` in the same repeat
(quartiles beside) and of its ratio to it.

    python bench/guardrails.py [--calls 2000] [--repeats 11] [--targets none,secrets,...]
    python bench/guardrails.py --instructions [--calls 200] [--before REV]
    python bench/guardrails.py --worst
    python bench/guardrails.py --detect-secrets


--instructions counts instead the instructions per call under callgrind (valgrind), a figure that
does not move with the machine's load: one process runs every target and size in turn, and
callgrind dumps its counts at each os.getppid() the bench calls around a target's calls. With it,
`none` also runs on the gateway as it was before guardrails (--before, by default the commit
before the first of issue 59's; unpacked with `git archive` into a temporary folder): what a call
cost then, against what it costs now without guardrails configured.

--worst times instead the scans of `secrets` and `injection` on 64 KiB texts made to be costly
(runs of what starts a pattern, texts dense with credentials or zero-width characters): the bound
of a built-in on the event loop.

--detect-secrets compares `secrets` with the library made for the job, detect-secrets (Yelp; not
a dependency: `pip install --no-deps --target DIR detect-secrets`, then PYTHONPATH=.:DIR): what
each reports of a few samples (ordinary text, and credentials whose value a mask needs), then, on
the same texts as above, CPU per scan of its `scan_line` with every plugin, without its two entropy
plugins, and of the plugins' own `analyze_string` (no settings, no filters), against
`builtin_secrets.credentials`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1024, 64 * 1024)
BUILTINS = ("secrets", "result_size", "denied_values", "url_hosts", "injection")  # BUILTIN_NAMES, in its order
TARGETS = ("none", "unconfigured", *BUILTINS, "all")
BEFORE_GUARDRAILS = "9e2f97a"  # the last commit before "Guardrails: the hook API, chains, ..." (issue 59)
ARGUMENTS = json.dumps({"url": "https://api.example.com/v1/items?page=2", "path": "/srv/data/items.json",
                        "query": "open issues about the parser"})
OPTIONS: dict[str, Any] = {"guardrail_denied_values": {"*": ["/etc/*", "*/.ssh/*", "*/id_rsa"]},
                           "guardrail_allowed_url_hosts": ["api.example.com", ".example.org"]}


def result_text(size: int) -> str:
    """`size` characters (ASCII, so as many bytes) of what a tool returns: JSON records, then prose."""
    records = [{"id": i, "title": f"Parser fails on nested lists ({i})", "state": "open", "comments": i % 7,
                "url": f"https://api.example.com/v1/items/{i}", "updated": f"2026-09-{i % 28 + 1:02d}"}
               for i in range(size // 150 + 1)]
    prose = ("The parser reads each list item in turn; a nested list inside an item ends the outer one too "
             "early, so the items after it are lost. A fix keeps a stack of open lists. ")
    text = json.dumps(records, indent=1) + "\n" + prose * (size // len(prose) + 1)
    return text[:size // 2] + "\n" + prose * (size // len(prose) + 1)


def executor_for(target: str, size: int) -> Any:
    """`target`'s executor; on the gateway before guardrails only `none` can be made."""
    from gateway.tools import Param, Tool, ToolExecutor, ToolRegistry

    text = result_text(size)[:size]

    async def fetch(args: dict[str, Any]) -> str:
        return text

    registry = ToolRegistry([Tool(name="fetch", description="Fetch", function=fetch, parameters=[
        Param("url", "string", required=True), Param("path", "string", required=True),
        Param("query", "string", required=True)])])
    if target == "none":
        return ToolExecutor(registry)
    from gateway.guardrails import Guardrails
    from gateway.settings.model import Settings

    names = [] if target == "unconfigured" else list(BUILTINS) if target == "all" else [target]
    guardrails = Guardrails.from_settings(Settings(guardrails=names, **OPTIONS), registry)
    if (guardrails is None) != (target == "unconfigured"):
        raise RuntimeError(f"{target}: Guardrails.from_settings gave {guardrails!r}")
    if guardrails is not None and [g.name for g in guardrails.for_tool(registry.get("fetch"), None)] != names:
        raise RuntimeError(f"{target}: the chain is not {names}")
    return ToolExecutor(registry, guardrails=guardrails)


def one_call(executor: Any) -> Callable[[], Any]:
    from gateway.tools import ToolCall, Turn

    call, turn = ToolCall("call_1", "fetch", ARGUMENTS), Turn(trajectory_id="bench")
    return lambda: executor.run_call(call, turn)


async def check(target: str, size: int, executor: Any) -> None:
    outcome = await one_call(executor)()
    if outcome.status != "ok" or outcome.content_text() != result_text(size)[:size]:
        raise RuntimeError(f"{target}, {size} B: {outcome.status}, {outcome.content_text()[:300]!r}")


async def cpu_per_call(op: Callable[[], Any], count: int) -> float:
    start = time.process_time()
    for _ in range(count):
        await op()
    return (time.process_time() - start) / count


async def measure(chosen: Sequence[str], calls: int, repeats: int) -> None:
    for size in SIZES:
        executors = {target: executor_for(target, size) for target in chosen}
        for target, executor in executors.items():
            await check(target, size, executor)
        ops = {target: one_call(executor) for target, executor in executors.items()}
        runs: dict[str, list[float]] = {target: [] for target in chosen}
        for repeat in range(repeats + 1):  # the first warms up, unmeasured
            order = list(chosen[repeat % len(chosen):]) + list(chosen[:repeat % len(chosen)])
            for target in order:
                gc.collect()
                seconds = await cpu_per_call(ops[target], calls if repeat else 200)
                if repeat:
                    runs[target].append(seconds)
        report(size, runs, calls, repeats)
        for executor in executors.values():
            await executor.aclose()


def report(size: int, runs: dict[str, list[float]], calls: int, repeats: int) -> None:
    print(f"\nresult of {size // 1024} KiB: CPU per call, {calls} calls a run, {repeats} runs (medians)")
    print(f"  {'target':14s} {'µs/call':>8s}  {'added µs (quartiles)':>26s}  {'ratio to none':>13s}")
    for target, values in runs.items():
        line = f"  {target:14s} {statistics.median(values) * 1e6:8.1f}"
        if target != "none" and "none" in runs:
            added = [(a - b) * 1e6 for a, b in zip(values, runs["none"], strict=True)]
            ratios = [a / b for a, b in zip(values, runs["none"], strict=True)]
            low, _, high = statistics.quantiles(added, n=4)
            line += (f"  {statistics.median(added):+9.1f} ({low:+7.1f} to {high:+7.1f})"
                     f"  {statistics.median(ratios):13.2f}")
        print(line)


# --- --instructions ----------------------------------------------------------------------------------

async def counted(plan: Sequence[tuple[str, int]], calls: int) -> None:
    """In the process callgrind runs: each (target, size) of `plan` made and warmed up, then its
    `calls` calls between two os.getppid(), where callgrind dumps its counts."""
    for target, size in plan:
        executor = executor_for(target, size)
        op = one_call(executor)
        for _ in range(20):
            await op()
        gc.collect()
        os.getppid()
        for _ in range(calls):
            await op()
        os.getppid()
        await executor.aclose()


def callgrind(tree: Path, plan: Sequence[tuple[str, int]], calls: int, folder: Path) -> list[float]:
    """Instructions per call of each of `plan`, run on the gateway in `tree` under callgrind."""
    out = folder / f"{tree.name}.out"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    spec = ",".join(f"{target}:{size}" for target, size in plan)
    subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=getppid", f"--callgrind-out-file={out}",
                    sys.executable, str(Path(__file__).resolve()), "--count", spec, "--calls", str(calls)],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = sorted(folder.glob(f"{out.name}.*"), key=lambda path: int(path.suffix[1:]))
    totals = [next(int(line.split()[1]) for line in dump.read_text().splitlines() if line.startswith("totals:"))
              for dump in dumps]
    return [total / calls for total in totals[1::2]]  # the dumps alternate: making a target, its calls


def instructions(chosen: Sequence[str], calls: int, before: str) -> None:
    plan = [(target, size) for size in SIZES for target in chosen]
    with tempfile.TemporaryDirectory(prefix="toolspan-bench-guardrails-") as name:
        folder = Path(name)
        now = dict(zip(plan, callgrind(ROOT, plan, calls, folder), strict=True))
        old_tree = folder / f"before-{before}"
        old_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", before, "gateway"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
        then = dict(zip([("none", size) for size in SIZES],
                        callgrind(old_tree, [("none", size) for size in SIZES], calls, folder), strict=True))
    for size in SIZES:
        print(f"\nresult of {size // 1024} KiB: instructions per call ({calls} calls counted, callgrind)")
        print(f"  {'none, before guardrails':26s} {then[('none', size)] / 1000:9.1f} thousand ({before})")
        for target in chosen:
            found = now[(target, size)]
            print(f"  {target:26s} {found / 1000:9.1f} thousand  {found / now[('none', size)]:6.2f} of none, "
                  f"{found / then[('none', size)]:6.2f} of none before")


# --- --worst -----------------------------------------------------------------------------------------

def worst_texts(size: int) -> dict[str, str]:
    """Texts of `size` characters made to cost the scans the most."""
    def repeated(unit: str) -> str:
        return (unit * (size // len(unit) + 1))[:size]

    return {"eyJ run": repeated("eyJ"), "JWT-like, dense": repeated("eyJ" + "a" * 20 + "."),
            "sk- run": repeated("sk-"), "password= run": repeated("password="), "api_key= run": repeated("api_key="),
            "quoted values": repeated('password="'), "AWS key ids": repeated("AKIA" + "B" * 16 + " "),
            "Authorization": repeated("authorization:"), "URL userinfo": repeated("://a:"),
            "ignore all": repeated("ignore all all all "), "<| run": repeated("<|"),
            "zero-width": repeated("\u200d"), "zero-width, apart": repeated("\u200da"),
            "tag characters": repeated("\U000e0041"), "ordinary text": result_text(size)[:size]}


def worst() -> None:
    from gateway.guardrails.builtin_injection import marker
    from gateway.guardrails.builtin_secrets import credentials, masked

    print(f"CPU per scan of 64 KiB, median of 5 runs\n  {'text':20s} {'secrets':>10s} {'injection':>10s}")
    for label, text in worst_texts(64 * 1024).items():
        secrets = cpu_per_scan(lambda text: masked(text, credentials(text)), text)
        injection = cpu_per_scan(marker, text)
        print(f"  {label:20s} {secrets * 1e3:7.2f} ms {injection * 1e3:7.2f} ms")


# --- --detect-secrets --------------------------------------------------------------------------------

def cpu_per_scan(scan: Callable[[str], object], text: str) -> float:
    """The median CPU seconds of `scan(text)` over enough scans to take a second or so."""
    scan(text)
    start = time.process_time()
    scan(text)
    count = max(3, min(2000, int(0.2 / max(time.process_time() - start, 1e-6))))
    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(count):
            scan(text)
        runs.append((time.process_time() - start) / count)
    return statistics.median(runs)


SAMPLES = {
    "git SHA": "commit 3f786850e387550fdab836ed7e6dc881de23001b fixed the parser",
    "UUID": "request 12345678-1234-5678-1234-567812345678 done",
    "base64 image": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwAD"
                    "hgGAWjR9awAAAABJRU5ErkJggg==",
    "prose": "The quick brown fox jumps over the lazy dog; the password reset link was sent.",
    "GitHub token": "token ghp_R8vK2mQ9xZ4tL7wN1pC5sD3fG6hJ0kB2aE4y",
    "private key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq7Lp2Rm9Zt4Kw1Nv8Bc3Yd6Hf0Ju5Ge2Sa7Ti9Ox\n"
                   "-----END RSA PRIVATE KEY-----",
    "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTQyIn0.Xq7Lp2Rm9Zt4Kw1Nv8Bc3Yd6Hf0Ju5Ge2Sa7Ti9Ox",
}


def shortened(value: str) -> str:
    return repr(value if len(value) <= 24 else value[:21] + "...")


def against_detect_secrets() -> None:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import default_settings, transient_settings

    from gateway.guardrails.builtin_secrets import credentials

    with default_settings():
        for label, sample in SAMPLES.items():
            theirs = list(scan_line(sample))
            named = [f"{found.type}: {shortened(found.secret_value or '')}" for found in theirs
                     if "Entropy" not in found.type]
            entropy = len(theirs) - len(named)
            print(f"{label:13s} detect-secrets: {', '.join(named) or 'none'}; {entropy} by its entropy plugins")
            print(f"{'':13s} secrets:        "
                  f"{', '.join(f'{item.kind}: {shortened(item.value)}' for item in credentials(sample)) or 'none'}")
    plugins = [kind.__name__ for kind in get_mapping_from_secret_type_to_class().values()]
    no_entropy = [name for name in plugins if "Entropy" not in name]
    instances = [kind() for kind in get_mapping_from_secret_type_to_class().values() if kind.__name__ in no_entropy]
    for size in SIZES:
        text = result_text(size)[:size]
        ours = cpu_per_scan(credentials, text)
        with default_settings():
            every = cpu_per_scan(lambda line: list(scan_line(line)), text)
        with transient_settings({"plugins_used": [{"name": name} for name in no_entropy]}):
            quiet = cpu_per_scan(lambda line: list(scan_line(line)), text)
        direct = cpu_per_scan(lambda line: [list(plugin.analyze_string(line)) for plugin in instances], text)
        print(f"\nresult of {size // 1024} KiB: CPU per scan")
        for name, seconds in (("secrets (builtin_secrets.credentials)", ours),
                              (f"detect-secrets scan_line, {len(plugins)} plugins", every),
                              (f"detect-secrets scan_line, {len(no_entropy)} (no entropy)", quiet),
                              ("detect-secrets plugins' analyze_string", direct)):
            print(f"  {name:44s} {seconds * 1e6:10.1f} µs  {seconds / ours:7.1f} x secrets")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=None, help="calls a run (default 2000; 200 counted)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {','.join(TARGETS)}")
    parser.add_argument("--instructions", action="store_true", help="instead: instructions per call, callgrind")
    parser.add_argument("--before", default=BEFORE_GUARDRAILS, help="with --instructions: the gateway before")
    parser.add_argument("--worst", action="store_true", help="instead: scans of texts made to be costly")
    parser.add_argument("--detect-secrets", action="store_true", help="instead: secrets against detect-secrets")
    parser.add_argument("--count", help=argparse.SUPPRESS)  # target:size,... in the process callgrind runs
    options = parser.parse_args(argv)
    if options.count is not None:
        plan = [(item.split(":")[0], int(item.split(":")[1])) for item in options.count.split(",")]
        asyncio.run(counted(plan, options.calls))
        return
    if options.detect_secrets or options.worst:
        against_detect_secrets() if options.detect_secrets else worst()
        return
    chosen = options.targets.split(",")
    if unknown := set(chosen) - set(TARGETS):
        parser.error(f"unknown target {', '.join(sorted(unknown))}")
    if "none" not in chosen:
        chosen.insert(0, "none")  # the baseline of every figure
    if options.instructions:
        instructions(chosen, options.calls or 200, options.before)
    else:
        asyncio.run(measure(chosen, options.calls or 2000, options.repeats))


if __name__ == "__main__":
    main()
