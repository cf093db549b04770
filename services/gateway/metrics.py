"""Prometheus text exposition: the gateway's own counters and TTFT histogram, plus every role's
counters (fetched with the Stats RPC), all prefixed ``tessera_``."""

from __future__ import annotations

import threading
from bisect import bisect_left

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.status_to_count: dict[str, int] = {}
        self.ttft_bucket_counts = [0] * (len(TTFT_BUCKETS_S) + 1)
        self.ttft_sum = 0.0
        self.ttft_count = 0

    def record_request(self, status: int) -> None:
        with self._lock:
            key = str(status)
            self.status_to_count[key] = self.status_to_count.get(key, 0) + 1

    def record_ttft(self, seconds: float) -> None:
        with self._lock:
            self.ttft_bucket_counts[bisect_left(TTFT_BUCKETS_S, seconds)] += 1
            self.ttft_sum += seconds
            self.ttft_count += 1

    def render(self, role_counters: dict[str, dict[str, float]]) -> str:
        lines = ["# TYPE tessera_requests_total counter"]
        with self._lock:
            for status, count in sorted(self.status_to_count.items()):
                lines.append(f'tessera_requests_total{{status="{status}"}} {count}')
            lines.append("# TYPE tessera_ttft_seconds histogram")
            cumulative = 0
            for bound, count in zip(TTFT_BUCKETS_S, self.ttft_bucket_counts):
                cumulative += count
                lines.append(f'tessera_ttft_seconds_bucket{{le="{bound}"}} {cumulative}')
            lines.append(f'tessera_ttft_seconds_bucket{{le="+Inf"}} {self.ttft_count}')
            lines.append(f"tessera_ttft_seconds_sum {self.ttft_sum}")
            lines.append(f"tessera_ttft_seconds_count {self.ttft_count}")
        merged: dict[str, float] = {}
        for role, counters in sorted(role_counters.items()):
            for name, value in counters.items():
                merged[name] = merged.get(name, 0.0) + value
            name, _, address = role.partition("@")
            lines.append(f'tessera_node_up{{role="{name}",address="{address}"}} 1')
        for name, value in sorted(merged.items()):
            kind = "counter" if name.endswith("_total") else "gauge"
            lines.append(f"# TYPE tessera_{name} {kind}")
            lines.append(f"tessera_{name} {value:g}")
        return "\n".join(lines) + "\n"
