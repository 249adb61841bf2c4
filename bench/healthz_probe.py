"""How long `/healthz` takes while a fault happens: a prober on its own thread and event loop.

The fault benches (bench/faults_*.py) start a gateway, start this prober against it, cause the
fault, and stop the prober when the fault is over. It asks `GET /healthz` one request at a time,
every --interval seconds, on a connection of its own, so that a gateway whose event loop is
stalled shows the stall as latency here (the prober's own loop is not the gateway's, even when
the gateway runs in the same process).

    with HealthzProbe("http://127.0.0.1:8080") as probe:
        ...cause the fault...
    print(probe.summary())   # {"count": ..., "p50_ms": ..., "p99_ms": ..., "max_ms": ..., "failed": ...}
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp


class HealthzProbe:
    def __init__(self, base_url: str, interval: float = 0.01, timeout: float = 5.0) -> None:
        self.url = base_url.rstrip("/") + "/healthz"
        self.interval = interval
        self.timeout = timeout
        self.latencies: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthz-probe", daemon=True)

    def __enter__(self) -> HealthzProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        asyncio.run(self._probe())

    async def _probe(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop.is_set():
                began = time.perf_counter()
                try:
                    async with session.get(self.url) as response:
                        await response.read()
                        ok = response.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                self.latencies.append(time.perf_counter() - began)
                self.failed += not ok
                await asyncio.sleep(self.interval)

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        if not ordered:
            return {"count": 0, "failed": self.failed}

        def at(share: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 1)

        return {"count": len(ordered), "p50_ms": round(statistics.median(ordered) * 1000, 1),
                "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 1), "failed": self.failed}


Phase = Callable[[str, str, str], Awaitable[dict[str, Any]]]  # (gateway URL, provider URL, phase) -> result


def phases_under_probe(name: str, provider_source: str, ready_path: str, phases: Sequence[str],
                       run: Phase) -> list[dict[str, Any]]:
    """A scripted provider (`provider_source`, run with its port as its argument) and a gateway in
    front of it; each phase `run` under a probe of `/healthz`, its result printed as it comes. Both
    processes end with it."""
    from faults_passthrough_errors import wait_ready
    from proxy import _free_port
    from scale import start_gateway

    provider_port = _free_port()
    provider_url = f"http://127.0.0.1:{provider_port}"
    provider = subprocess.Popen([sys.executable, "-c", provider_source, str(provider_port)])
    target = start_gateway(name, 1, None, f"{provider_url}/v1")
    results = []
    try:
        asyncio.run(wait_ready(provider_url + ready_path))
        asyncio.run(wait_ready(f"{target.url}/healthz"))
        for phase in phases:
            with HealthzProbe(target.url) as probe:
                result = asyncio.run(run(target.url, provider_url, phase))
            results.append({**result, "healthz": probe.summary()})
            print(json.dumps(results[-1]), flush=True)
    finally:
        for process in (provider, target.process):
            process.terminate()
        for process in (provider, target.process):
            process.wait(timeout=30)
    return results
