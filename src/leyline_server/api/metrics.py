"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]


class Metrics:
    """Requests, splices by outcome and fallback code, token counts, admission, latencies."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("leyline_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.splices = Counter(
            "leyline_splices", "Splices by outcome and fallback code", ["outcome", "code"], registry=self.registry
        )
        self.tokens = Counter("leyline_tokens", "Prompt tokens by treatment", ["kind"], registry=self.registry)
        self.sessions = Gauge("leyline_sessions", "Live sessions", registry=self.registry)
        self.sessions_dropped = Gauge(
            "leyline_sessions_dropped", "Sessions dropped (LRU, TTL or deleted) since start", registry=self.registry
        )
        self.kv_reserved = Gauge(
            "leyline_kv_reserved_tokens", "KV tokens reserved by requests in flight", registry=self.registry
        )
        self.retractions = Gauge(
            "leyline_retractions", "Streams retracted (KV given back, resumed) since start", registry=self.registry
        )
        self.admission_waiting = Gauge(
            "leyline_admission_waiting",
            "Requests waiting for admission (a slot or their key's share)",
            registry=self.registry,
        )
        self.latency = Histogram(
            "leyline_request_seconds",
            "Request latency",
            ["route"],
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.splice_ms = Histogram(
            "leyline_splice_ms",
            "Splice time in milliseconds",
            registry=self.registry,
            buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000),
        )

    def record_tokens(self, reused: int, rotated: int, prefilled: int, approximate: int) -> None:
        """Count the prompt tokens of one request by what happened to them (``approximate``:
        served with rotated or downstream-of-rotated KV; a subset of the others)."""
        self.tokens.labels("reused").inc(reused)
        self.tokens.labels("rotated").inc(rotated)
        self.tokens.labels("prefilled").inc(prefilled)
        self.tokens.labels("approximate").inc(approximate)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
