"""Metric families whose series only the event loop's thread moves (`LoopMetric`): a series is
moved by plain addition, with no lock; the registry collects them as prometheus_client's own
(`telemetry.metrics` declares them)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

from telemetry import names

EXEMPLAR_INTERVAL = 1.0  # seconds: at most one exemplar per bucket of a series in this time


class CounterSeries:
    """One series of a counter."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class GaugeSeries:
    """One series of a gauge."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramSeries:
    """One series of a histogram, linking its buckets to traces: an observation with a trace id
    takes it as its bucket's exemplar when that bucket has taken none for EXEMPLAR_INTERVAL, and
    is observed plainly otherwise.

    Exemplars are samples: a bucket shows only its latest, and a scrape (every 15 s or so) sees
    only that one, so at most one a second per bucket and series loses nothing a dashboard shows
    (Grafana draws the exemplars Prometheus scraped; a scrape more often than once a second may
    show a bucket's exemplar again), while each observation of a busy series does not pay for
    one, the trace id formatted only when taken."""

    __slots__ = ("_bounds", "_counts", "_due", "_exemplars", "_labels", "_sum", "created")

    def __init__(self, bounds: tuple[float, ...], labels: tuple[str, ...]) -> None:
        self._bounds = bounds  # the upper bounds, +Inf last
        self._labels = labels  # the same, as the `le` label writes them
        self._counts = [0] * len(bounds)  # per bucket, not cumulative
        self._sum = 0.0
        self._exemplars: list[Exemplar | None] = [None] * len(bounds)
        self._due = [float("-inf")] * len(bounds)  # per bucket: when it may take an exemplar again
        self.created = time.time()

    def observe(self, value: float, trace_id: int | None = None, now: float = 0.0) -> None:
        """`value` observed; `trace_id` is the trace behind it (None: a trace nobody keeps). `now`:
        a monotonic clock in seconds (perf_counter, which the caller measured `value` with)."""
        bucket = bisect_left(self._bounds, value)  # the first bound >= value, as Prometheus counts
        self._counts[bucket] += 1
        self._sum += value
        if trace_id is not None and now >= self._due[bucket]:
            self._due[bucket] = now + EXEMPLAR_INTERVAL
            self._exemplars[bucket] = Exemplar({names.EXEMPLAR_TRACE_ID: format(trace_id, "032x")}, value, time.time())

    def buckets(self) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
        """The cumulative buckets as prometheus_client's families take them."""
        found: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        total = 0
        for label, count, exemplar in zip(self._labels, self._counts, self._exemplars, strict=True):
            total += count
            found.append((label, float(total)) if exemplar is None else (label, float(total), exemplar))
        return found

    @property
    def sum(self) -> float:
        return self._sum


Series = TypeVar("Series", CounterSeries, GaugeSeries, HistogramSeries)


class LoopMetric(Generic[Series]):
    """A metric family whose series only the event loop's thread moves, so that moving one is a
    plain addition with no lock, several times cheaper than prometheus_client's metrics (a lock,
    and checks, each). Registered on the registry as a collector, so the page, both its formats
    and the exemplars are prometheus_client's own. A metric without labels is its one series."""

    def __init__(self, kind: str, name: str, documentation: str, labelnames: Sequence[str],
                 make: Callable[[], Series], registry: CollectorRegistry) -> None:
        self._kind = kind
        self._name = name.removesuffix("_total") if kind == "counter" else name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._make: Callable[[], Series] = make
        self._series: dict[tuple[str, ...], Series] = {}
        if not self._labelnames:
            self._series[()] = make()
        registry.register(self)

    def labels(self, *values: str) -> Series:
        """The series of these label values, made on first use (the callers' labels are bounded)."""
        found = self._series.get(values)
        if found is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name} takes the labels {', '.join(self._labelnames)}")
            found = self._series[values] = self._make()
        return found

    @property
    def series(self) -> Series:
        """The one series of a metric without labels."""
        return self._series[()]

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for values, series in self._series.items():
            if isinstance(series, CounterSeries):
                assert isinstance(family, CounterMetricFamily)
                family.add_metric(values, series.value, created=series.created)
            elif isinstance(series, GaugeSeries):
                assert isinstance(family, GaugeMetricFamily)
                family.add_metric(values, series.value)
            else:
                assert isinstance(family, HistogramMetricFamily)
                family.add_metric(values, series.buckets(), series.sum)
                family.samples.append(Sample(f"{self._name}_created", dict(zip(self._labelnames, values, strict=True)),
                                             series.created))
        return [family]

    def _family(self) -> CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily:
        if self._kind == "counter":
            return CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        if self._kind == "gauge":
            return GaugeMetricFamily(self._name, self._documentation, labels=self._labelnames)
        return HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)


def counter(name: str, documentation: str, labels: Sequence[str], registry: CollectorRegistry
            ) -> LoopMetric[CounterSeries]:
    return LoopMetric("counter", name, documentation, labels, CounterSeries, registry)


def histogram(name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float],
              registry: CollectorRegistry) -> LoopMetric[HistogramSeries]:
    bounds = (*buckets, float("inf"))
    written = tuple(floatToGoString(bound) for bound in bounds)  # type: ignore[no-untyped-call]
    return LoopMetric("histogram", name, documentation, labels, lambda: HistogramSeries(bounds, written), registry)
