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
import statistics
import threading
import time
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
