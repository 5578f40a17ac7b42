"""The embedding cache's metrics on Triton's metrics port, when the ranker runs in Triton.

Inside a python-backend stub the cache counts into this process's ``prometheus_client``
registry, which no ``/metrics`` serves. ``TritonMetricsMirror`` copies those counters, as
increments, into Triton custom metrics (``pb_utils.MetricFamily``) of the same names and
label sets, served by Triton beside ``nv_inference_*``. Every instance of the ranker adds its
own increments to the same series. It syncs from ``execute`` at most every ``interval_s``
(each increment is a round trip to the server), so the port lags by up to that much traffic.

Triton's custom metrics have no histogram kind. The lookup-latency histogram is sent as what
a histogram is on the wire: cumulative counters ``<name>_bucket{le}``, ``<name>_count`` and
``<name>_sum``, each a Triton COUNTER, so ``histogram_quantile`` reads them as usual. Gauges
(the cache's open Redis breakers) are sent as Triton GAUGEs, set to their current value.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from services.embedding_cache.metrics import DEFAULTS, EVICTIONS, LOOKUP_SECONDS, LOOKUPS
from services.metrics import BREAKERS_OPEN

COUNTERS = (LOOKUPS, EVICTIONS, DEFAULTS, LOOKUP_SECONDS, BREAKERS_OPEN)
CUMULATIVE_SUFFIXES = ("_total", "_bucket", "_count", "_sum")  # not _created (a timestamp)


class TritonMetricsMirror:
    """Copies ``counters`` (and histograms, as their cumulative series) into Triton COUNTER
    families, and gauges into GAUGE families, through ``pb_utils``."""

    def __init__(
        self,
        pb_utils: Any,
        counters: Sequence[Counter | Histogram | Gauge] = COUNTERS,
        interval_s: float = 1.0,
    ) -> None:
        self.pb_utils = pb_utils
        self.counters = list(counters)
        self.interval_s = interval_s
        self.families: dict[str, Any] = {}
        self.metrics: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self.sent: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.last_sync = float("-inf")

    def _metric(
        self, name: str, documentation: str, labels: dict[str, str], gauge: bool = False
    ) -> Any:
        key = (name, tuple(sorted(labels.items())))
        metric = self.metrics.get(key)
        if metric is None:
            family = self.families.get(name)
            if family is None:
                kinds = self.pb_utils.MetricFamily
                family = self.families[name] = kinds(
                    name=name,
                    description=documentation,
                    kind=kinds.GAUGE if gauge else kinds.COUNTER,
                )
            metric = self.metrics[key] = family.Metric(labels=labels)
            self.sent[key] = 0.0
        return metric

    def sync(self, force: bool = False) -> None:
        """Send what the counters gained since the last sync (when ``interval_s`` passed)."""
        now = time.monotonic()
        if not force and now - self.last_sync < self.interval_s:
            return
        self.last_sync = now
        for counter in self.counters:
            for family in counter.collect():
                if family.type == "gauge":  # sent when it changed (a new one starts at 0)
                    for sample in family.samples:
                        metric = self._metric(
                            sample.name, family.documentation, sample.labels, gauge=True
                        )
                        key = (sample.name, tuple(sorted(sample.labels.items())))
                        if sample.value != self.sent[key]:
                            metric.set(sample.value)
                            self.sent[key] = sample.value
                    continue
                for sample in family.samples:
                    if not sample.name.endswith(CUMULATIVE_SUFFIXES):
                        continue  # the _created timestamps
                    metric = self._metric(sample.name, family.documentation, sample.labels)
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    delta = sample.value - self.sent[key]
                    if delta > 0:
                        metric.increment(delta)
                        self.sent[key] = sample.value
