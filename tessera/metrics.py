"""Prometheus metrics: a registry per process, gauges read from live stats at scrape time.

Services keep their own counters (as plain dataclasses, also returned by GetStats);
`StatsCollector` turns them into metric families when Prometheus scrapes, so nothing is
counted twice and the numbers in /metrics and GetStats always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.startup_flags import port_number

# (name, help, kind) -> value, read at scrape time. kind is "counter" or "gauge".
Reading = tuple[str, str, str, float]


class StatsCollector(Collector):
    def __init__(self, read: Callable[[], Iterable[Reading]]):
        self._read = read

    def collect(self) -> Iterable[Metric]:
        for name, documentation, kind, value in self._read():
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield family(name, documentation, value=value)


# (metric name, help, kind, field of a stats message)
StatField = tuple[str, str, str, str]


def readings_from(stats, fields: Iterable[StatField]) -> Iterable[Reading]:
    """Readings of a stats message (e.g. EncoderStats) for each (name, help, kind, field)."""
    for name, documentation, kind, field in fields:
        yield name, documentation, kind, float(getattr(stats, field))


def new_registry(read: Callable[[], Iterable[Reading]] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry()
    if read is not None:
        registry.register(StatsCollector(read))
    return registry


def serve_metrics(port: int, host: str, registry: CollectorRegistry) -> None:
    """/metrics over HTTP on `port` (0: off)."""
    if port:
        start_http_server(port, addr=host, registry=registry)


def add_metrics_flag(parser, default: int = 0) -> None:
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        default=default,
        help="serve Prometheus /metrics on this port (0: off)",
    )
