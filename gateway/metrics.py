"""A few counters and timings, served in Prometheus text format at /metrics."""

from __future__ import annotations

import threading
from collections import defaultdict

_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = defaultdict(float)
        self.hist: dict[str, list[int]] = {}
        self.sums: dict[str, float] = defaultdict(float)

    def inc(self, name: str, value: float = 1.0) -> None:
        with self._lock:
            self.counters[name] += value

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            buckets = self.hist.setdefault(name, [0] * (len(_BUCKETS) + 1))
            for i, edge in enumerate(_BUCKETS):
                if seconds <= edge:
                    buckets[i] += 1
            buckets[-1] += 1
            self.sums[name] += seconds

    def render(self, gauges: dict[str, float] | None = None) -> str:
        lines: list[str] = []
        with self._lock:
            for name, value in sorted(self.counters.items()):
                lines += [f"# TYPE {name} counter", f"{name} {value:g}"]
            for name, buckets in sorted(self.hist.items()):
                lines.append(f"# TYPE {name} histogram")
                for edge, count in zip(_BUCKETS, buckets, strict=False):
                    lines.append(f'{name}_bucket{{le="{edge}"}} {count}')
                lines.append(f'{name}_bucket{{le="+Inf"}} {buckets[-1]}')
                lines.append(f"{name}_count {buckets[-1]}")
                lines.append(f"{name}_sum {self.sums[name]:.6f}")
        for name, value in sorted((gauges or {}).items()):
            lines += [f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"
