"""Prometheus metrics of one engine (own registry, so several engines can live in one process)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class EngineMetrics:
    def __init__(self, model: str):
        self.registry = CollectorRegistry()
        labels = ["model", "priority"]

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.ttft = histogram("tokenyard_engine_ttft_seconds", "Time to first token")
        self.itl = histogram("tokenyard_engine_itl_seconds", "Inter-token latency")
        self.e2e = histogram("tokenyard_engine_e2e_seconds", "Arrival to last token")
        self.queue = histogram("tokenyard_engine_queue_seconds", "Arrival to first scheduling")
        self.kv_usage = Gauge(
            "tokenyard_engine_kv_usage_ratio",
            "Share of KV blocks in use",
            ["model"],
            registry=self.registry,
        )
        self.running = Gauge(
            "tokenyard_engine_running", "Sequences running", ["model"], registry=self.registry
        )
        self.waiting = Gauge(
            "tokenyard_engine_waiting", "Sequences waiting", ["model"], registry=self.registry
        )
        self.prefix_queries = Counter(
            "tokenyard_engine_prefix_cache_queries_tokens",
            "Prompt tokens looked up in the prefix cache",
            ["model"],
            registry=self.registry,
        )
        self.prefix_hits = Counter(
            "tokenyard_engine_prefix_cache_hits_tokens",
            "Prompt tokens found in the prefix cache",
            ["model"],
            registry=self.registry,
        )
        self.preemptions = Counter(
            "tokenyard_engine_preemptions", "Sequences preempted", ["model"], registry=self.registry
        )
        self.tokens = Counter(
            "tokenyard_engine_generated_tokens", "Tokens generated", labels, registry=self.registry
        )
        self.model = model
