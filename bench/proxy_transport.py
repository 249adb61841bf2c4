"""What an egress proxy costs the gateway: the same gateway (`toolspan`, as in bench/proxy.py)
reaching the same upstream directly and through a local tinyproxy (`upstream_proxy`), plain Chat
and Responses requests, on both of the proxy's paths:

- http: an http:// provider, whose requests go to the proxy in absolute form (tinyproxy keeps no
  connection past one answer, so each call opens one);
- https (`--tls`): an https:// provider with a private CA (trustme, `upstream_ca_bundle`), reached
  directly or through a CONNECT tunnel (a tunnel is kept as long as the gateway keeps it).

    python bench/proxy_transport.py [--rounds 3] [--seconds 4] [--tls]

It needs `wrk` and `tinyproxy` (Debian packages). Per round, the two gateways of a pair are loaded
in turn (the order alternating) with wrk at 10 connections for the gateway's CPU per request (all
its threads; the proxy's own CPU is not counted: it is another process, as it would be another
machine) and at one connection for p50 latency. The figures are medians of the rounds; the ratio
is the median of the per-round ratios, all pairs measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from proxy import SCENARIOS, Scenario, _free_port, _start, _wait_ready, need_program, sample

CONFIG = "Port {port}\nListen 127.0.0.1\nTimeout 30\nMaxClients 200\nDisableViaHeader Yes\nLogLevel Critical\n"
Pair = dict[str, tuple[subprocess.Popen[bytes], str]]  # "direct" / "through tinyproxy" -> gateway, its /v1 URL


def _start_tinyproxy(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    config = folder / "tinyproxy.conf"
    config.write_text(CONFIG.format(port=port))
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    return subprocess.Popen([binary, "-d", "-c", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL), f"http://127.0.0.1:{port}"


def _start_gateway(upstream: str, settings: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """A `toolspan` bench target whose Settings read `settings` (TOOLSPAN_* variables) too."""
    port = _free_port()
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        process = _start("toolspan", port, upstream)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    return process, f"http://127.0.0.1:{port}/v1"


def _tls_upstream(folder: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """bench/proxy.py's upstream over TLS, its certificate issued by a CA of trustme's: the
    process, its URL, and the CA's PEM file (for upstream_ca_bundle)."""
    import trustme

    ca = trustme.CA()
    ca_file, cert_file = folder / "ca.pem", folder / "upstream.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    port = _free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve-tls", str(port), str(cert_file)],
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
                               stdout=subprocess.DEVNULL)
    return process, f"https://127.0.0.1:{port}", ca_file


async def _serve_tls(port: int, cert_file: str) -> None:
    from aiohttp import web

    from gateway.demo.agent import FastPolicy
    from gateway.demo.model import ScriptedModel

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file)
    runner = web.AppRunner(ScriptedModel(FastPolicy()).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    await asyncio.Event().wait()


def _pair(upstream: str, proxy_url: str, settings: Mapping[str, str]) -> Pair:
    return {"direct": _start_gateway(upstream + "/v1", {**settings, "TOOLSPAN_UPSTREAM_PROXY": "direct"}),
            "through tinyproxy": _start_gateway(upstream + "/v1", {**settings, "TOOLSPAN_UPSTREAM_PROXY": proxy_url})}


def _measure(label: str, pair: Pair, scenario: Scenario, rounds: int, seconds: int) -> None:
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in pair}
    for round_ in range(rounds):
        for name in list(pair) if round_ % 2 == 0 else list(reversed(pair)):
            process, url = pair[name]
            taken = sample(process.pid, url + scenario.path, scenario, "toolspan", seconds, 0)
            found[name].append((taken.cpu_us, taken.p50_1_ms))
    direct, proxied = found["direct"], found["through tinyproxy"]
    ratios = [p[0] / d[0] for d, p in zip(direct, proxied, strict=True)]
    added = [p[1] - d[1] for d, p in zip(direct, proxied, strict=True)]
    for name, values in found.items():
        print(f"{label} {scenario.name}, {name}: CPU {statistics.median(v[0] for v in values):.0f} µs a request, "
              f"p50 at c=1 {statistics.median(v[1] for v in values):.2f} ms")
    print(f"{label} {scenario.name}: through the proxy ÷ direct, CPU {statistics.median(ratios):.2f}; "
          f"p50 added {statistics.median(added):.2f} ms", flush=True)


def _run(folder: Path, args: argparse.Namespace, processes: list[subprocess.Popen[bytes]]) -> None:
    upstream_port = _free_port()
    processes.append(_start("upstream", upstream_port))
    tinyproxy, proxy_url = _start_tinyproxy(folder)
    processes.append(tinyproxy)
    pairs = {"http": _pair(f"http://127.0.0.1:{upstream_port}", proxy_url, {})}
    if args.tls:
        tls_process, tls_url, ca_file = _tls_upstream(folder)
        processes.append(tls_process)
        pairs["https"] = _pair(tls_url, proxy_url, {"TOOLSPAN_UPSTREAM_CA_BUNDLE": str(ca_file)})
    for pair in pairs.values():
        processes.extend(process for process, _ in pair.values())
        for _, url in pair.values():
            asyncio.run(_wait_ready(url + "/chat/completions"))
    for scenario in (s for s in SCENARIOS if s.option in ("plain", "responses-plain")):
        for label, pair in pairs.items():
            _measure(label, pair, scenario, args.rounds, args.seconds)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--tls", action="store_true", help="also an https provider: direct TLS vs a CONNECT tunnel")
    args = parser.parse_args(argv)
    need_program("wrk", "apt-get install wrk")
    need_program("tinyproxy", "apt-get install tinyproxy")
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="toolspan-bench-proxy-") as folder:
        try:
            _run(Path(folder), args, processes)
        finally:
            for process in processes:
                process.terminate()
                process.wait(10)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    if sys.argv[1:2] == ["--serve-tls"]:
        asyncio.run(_serve_tls(int(sys.argv[2]), sys.argv[3]))
    else:
        main()
