"""One metrics page for the workers of `toolspan serve --workers N`: each worker's own page, in
OpenMetrics (so that its exemplars come along), parsed by prometheus_client's parser, merged into
one set of families, and rendered by prometheus_client's encoders in the format the scraper asks
for.

The merge, per sample (a family's sample name and label set):
- counters, histogram buckets, `_count` and `_sum`: summed;
- gauges: summed (requests in flight over all workers), except the `*_up` gauges, which take the
  minimum: down when any worker sees it down;
- `_created` (when a series started): the earliest;
- exemplars: of each sample, the most recent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample, Timestamp

from telemetry import names
from telemetry.metrics import encoder_for

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"  # what each worker's page is in
_CREATED = "_created"  # prometheus_client's sample of when a counter or histogram series started
_STATES = ("info", "stateset")  # families that say what is, not how many: each worker says the same

_SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def _when(exemplar: Exemplar) -> tuple[float, float]:
    """When an exemplar was taken, to the nanosecond (a float of seconds since the epoch keeps
    only microseconds); one without a time is the oldest."""
    taken = exemplar.timestamp
    if taken is None:
        return (-math.inf, 0)
    if isinstance(taken, Timestamp):
        return (taken.sec, taken.nsec)
    return (math.floor(taken), (taken % 1) * 1e9)


def _latest(a: Exemplar | None, b: Exemplar | None) -> Exemplar | None:
    if a is None or b is None:
        return a or b
    return b if _when(b) >= _when(a) else a


def _combined(family: Metric, a: Sample, b: Sample) -> Sample:
    if a.name.endswith(_CREATED) or (family.type == "gauge" and family.name.endswith(names.UP_GAUGE_SUFFIX)):
        value = min(a.value, b.value)
    elif family.type in _STATES:
        value = max(a.value, b.value)
    else:
        value = a.value + b.value
    return a._replace(value=value, exemplar=_latest(a.exemplar, b.exemplar))


def merge(pages: Iterable[str]) -> list[Metric]:
    """The families of several OpenMetrics pages as one (see the module's docstring). A sample
    found on some pages only is taken as it is; samples keep the order they were first seen in, so
    each series' buckets stay together. Raises ValueError on a page the parser refuses, or a family
    whose type differs between pages."""
    families: dict[str, Metric] = {}
    samples: dict[str, dict[_SampleKey, Sample]] = {}
    for page in pages:
        for family in text_string_to_metric_families(page):  # type: ignore[no-untyped-call]
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                samples[family.name] = {}
            elif merged.type != family.type:
                raise ValueError(f"metric {family.name} is a {merged.type} on one page and a {family.type} on another")
            seen = samples[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                before = seen.get(key)
                seen[key] = sample if before is None else _combined(merged, before, sample)
    for name, merged in families.items():
        merged.samples = list(samples[name].values())
    return list(families.values())


class _Families(Collector):
    """Families made elsewhere, for prometheus_client's encoders to render."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: Sequence[Metric], accept: str | None) -> tuple[bytes, str]:
    """The page and its content type: OpenMetrics (with exemplars) when `accept` asks for it, else
    the classic text format."""
    encoder, content_type = encoder_for(accept)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return encoder(registry), content_type


def merged_page(pages: Sequence[bytes], accept: str | None) -> tuple[bytes, str]:
    """Several workers' OpenMetrics pages as one page, in the format `accept` asks for."""
    return render(merge(page.decode() for page in pages), accept)
