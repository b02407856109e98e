"""Prometheus metrics: a registry per process, gauges read from live stats at scrape time.

Services keep their own counters (as plain dataclasses, also returned by GetStats);
`StatsCollector` turns them into metric families when Prometheus scrapes, so nothing is
counted twice and the numbers in /metrics and GetStats always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# (name, help, kind) -> value, read at scrape time. kind is "counter" or "gauge".
Reading = tuple[str, str, str, float]


class StatsCollector(Collector):
    """`labels`: the same on every metric (the decoder's `model_name`, as vLLM's)."""

    def __init__(self, read: Callable[[], Iterable[Reading]], labels: Mapping[str, str]):
        self._read = read
        self._labels = dict(labels)

    def collect(self) -> Iterable[Metric]:
        for name, documentation, kind, value in self._read():
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(name, documentation, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), value)
            yield family


# (metric name, help, kind, field of a stats message)
StatField = tuple[str, str, str, str]


def readings_from(stats, fields: Iterable[StatField]) -> Iterable[Reading]:
    """Readings of a stats message (e.g. EncoderStats) for each (name, help, kind, field)."""
    for name, documentation, kind, field in fields:
        yield name, documentation, kind, float(getattr(stats, field))


def new_registry(
    read: Callable[[], Iterable[Reading]] | None = None, labels: Mapping[str, str] | None = None
) -> CollectorRegistry:
    registry = CollectorRegistry()
    if read is not None:
        registry.register(StatsCollector(read, labels or {}))
    return registry


def serve_metrics(port: int, host: str, registry: CollectorRegistry) -> None:
    """/metrics over HTTP on `port` (0: off)."""
    if port:
        start_http_server(port, addr=host, registry=registry)


def add_metrics_flag(parser, default: int = 0) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=default,
        help="serve Prometheus /metrics on this port (0: off)",
    )
