"""What an egress proxy costs the gateway: the same gateway (`toolspan`, as in bench/proxy.py)
reaching the same upstream directly and through a local tinyproxy (`upstream_proxy`, an http://
provider, so requests go to the proxy in absolute form), plain Chat and Responses requests.

    python bench/proxy_transport.py [--rounds 3] [--seconds 4]

It needs `wrk` and `tinyproxy` (Debian packages). Per round, both gateways are loaded in turn (the
order alternating) with wrk at 10 connections for the gateway's CPU per request (all its threads;
the proxy's own CPU is not counted: it is another process, as it would be another machine) and at
one connection for p50 latency. The figures are medians of the rounds; the ratio is the median of
the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from proxy import SCENARIOS, _free_port, _start, _wait_ready, need_program, sample

CONFIG = "Port {port}\nListen 127.0.0.1\nTimeout 30\nMaxClients 200\nDisableViaHeader Yes\nLogLevel Critical\n"


def _start_tinyproxy(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    config = folder / "tinyproxy.conf"
    config.write_text(CONFIG.format(port=port))
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    return subprocess.Popen([binary, "-d", "-c", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL), f"http://127.0.0.1:{port}"


def _start_gateway(upstream: str, proxy: str | None) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    saved = os.environ.get("TOOLSPAN_UPSTREAM_PROXY")
    os.environ["TOOLSPAN_UPSTREAM_PROXY"] = proxy or "direct"  # read by the server's Settings
    try:
        process = _start("toolspan", port, upstream)
    finally:
        if saved is None:
            del os.environ["TOOLSPAN_UPSTREAM_PROXY"]
        else:
            os.environ["TOOLSPAN_UPSTREAM_PROXY"] = saved
    return process, f"http://127.0.0.1:{port}/v1"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    args = parser.parse_args(argv)
    need_program("wrk", "apt-get install wrk")
    need_program("tinyproxy", "apt-get install tinyproxy")
    scenarios = [s for s in SCENARIOS if s.option in ("plain", "responses-plain")]
    with tempfile.TemporaryDirectory(prefix="toolspan-bench-proxy-") as folder:
        upstream_port = _free_port()
        processes = [_start("upstream", upstream_port)]
        upstream = f"http://127.0.0.1:{upstream_port}"
        try:
            tinyproxy, proxy_url = _start_tinyproxy(Path(folder))
            processes.append(tinyproxy)
            direct, direct_url = _start_gateway(upstream + "/v1", None)
            proxied, proxied_url = _start_gateway(upstream + "/v1", proxy_url)
            processes += [direct, proxied]
            for url in (direct_url, proxied_url):
                asyncio.run(_wait_ready(url + "/chat/completions"))
            targets = {"direct": (direct, direct_url), "through tinyproxy": (proxied, proxied_url)}
            for scenario in scenarios:
                found: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
                for round_ in range(args.rounds):
                    order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
                    for name in order:
                        process, url = targets[name]
                        taken = sample(process.pid, url + scenario.path, scenario, "toolspan", args.seconds, 0)
                        found[name].append((taken.cpu_us, taken.p50_1_ms))
                ratios = [p[0] / d[0] for d, p in zip(found["direct"], found["through tinyproxy"], strict=True)]
                added = [p[1] - d[1] for d, p in zip(found["direct"], found["through tinyproxy"], strict=True)]
                for name, values in found.items():
                    print(f"{scenario.name}, {name}: CPU {statistics.median(v[0] for v in values):.0f} µs a request, "
                          f"p50 at c=1 {statistics.median(v[1] for v in values):.2f} ms")
                print(f"{scenario.name}: through the proxy ÷ direct, CPU {statistics.median(ratios):.2f}; "
                      f"p50 added {statistics.median(added):.2f} ms", flush=True)
        finally:
            for process in processes:
                process.terminate()
                process.wait(10)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
