"""The gateway's Prometheus metrics, kept by prometheus-client and served at /metrics.

Each gateway has its own registry (tests and the trainer run several in one process).
Counters named by the serving code (`inc("turnstile_..._total")`) are made on first
use (a cause that never happened is absent); those a dashboard charts are declared up
front at 0, as are the histograms and gauges. docs/gateway.md lists them all.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# `*_created` timestamps double every series for nothing a dashboard uses
disable_created_metrics()

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
CONTENT_TYPE = CONTENT_TYPE_LATEST
# counters a dashboard charts: present (at 0) from the start, not only once they count
DECLARED_COUNTERS = (
    "turnstile_completions_total",
    "turnstile_prompt_tokens_total",
    "turnstile_completion_tokens_total",
    "turnstile_prompt_drift_total",
    "turnstile_tool_call_parse_failures_total",
    "turnstile_engine_errors_total",
    "turnstile_record_failures_total",
    "turnstile_rejected_requests_total",
    "turnstile_rewards_total",
    "turnstile_sessions_created_total",
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._counters: dict[str, Counter] = {}
        r = self.registry
        self.request_seconds = Histogram(
            "turnstile_http_request_seconds",
            "HTTP request latency, by route template, method and status code",
            ["endpoint", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.store_commit_seconds = Histogram(
            "turnstile_store_commit_seconds",
            "time to insert and commit one batch of completion records",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.engine_queue_depth = Gauge(
            "turnstile_engine_queue_depth",
            "choices admitted and generating or waiting for the engine now",
            registry=r,
        )
        self.sessions_active = Gauge(
            "turnstile_sessions_active", "sessions neither ended nor expired", registry=r
        )
        self.policy_version = Gauge(
            "turnstile_policy_version", "policy version the engine serves", registry=r
        )
        self.records_committed = Gauge(
            "turnstile_records_committed", "completion records committed since start", registry=r
        )
        self.record_batches = Gauge(
            "turnstile_record_batches", "commits those records took", registry=r
        )
        self.completion_seconds = Histogram(
            "turnstile_completion_seconds",
            "one answer, from its request being prepared to its record committed",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        for name in DECLARED_COUNTERS:
            self.inc(name, 0.0)

    def inc(self, name: str, value: float = 1.0) -> None:
        """Counter `name` up by `value`, made on first use (once, whichever thread asks)."""
        counter = self._counters.get(name)
        if counter is None:
            with self._lock:
                counter = self._counters.get(name)
                if counter is None:
                    counter = Counter(name, _help(name), registry=self.registry)
                    self._counters[name] = counter
        counter.inc(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_request(self, scope: dict[str, Any], status: int, seconds: float) -> None:
        """One HTTP request, labelled with its route's template (`/v1/sessions/{id}`),
        never the raw path, so the series stay few; unmatched paths share one label."""
        route = getattr(scope.get("route"), "path", "unmatched")
        self.request_seconds.labels(route, scope["method"], str(status)).observe(seconds)


def _help(name: str) -> str:
    return name.removeprefix("turnstile_").removesuffix("_total").replace("_", " ")
