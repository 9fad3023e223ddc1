"""Prometheus metrics of one engine (own registry, so several engines can live in one process)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class EngineMetrics:
    """Per-request series are labelled by model (a LoRA adapter's name for its requests) and
    priority; engine-wide ones are bound to the model here, so callers just set or increment
    them."""

    def __init__(self, model: str):
        self.registry = CollectorRegistry()
        per_request = ["model", "priority"]

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(
                f"tokenyard_engine_{name}", doc, per_request, buckets=_LATENCY_BUCKETS,
                registry=self.registry,
            )  # fmt: skip

        def engine_wide(kind: type[Gauge] | type[Counter], name: str, doc: str):
            series = kind(f"tokenyard_engine_{name}", doc, ["model"], registry=self.registry)
            return series.labels(model)

        self.ttft = histogram("ttft_seconds", "Time to first token")
        self.itl = histogram("itl_seconds", "Inter-token latency")
        self.e2e = histogram("e2e_seconds", "Arrival to last token")
        self.queue = histogram("queue_seconds", "Arrival to first scheduling")
        self.tokens = Counter(
            "tokenyard_engine_generated_tokens", "Tokens generated", per_request,
            registry=self.registry,
        )  # fmt: skip
        self.kv_usage = engine_wide(Gauge, "kv_usage_ratio", "Share of KV blocks in use")
        self.running = engine_wide(Gauge, "running", "Sequences running")
        self.waiting = engine_wide(Gauge, "waiting", "Sequences waiting")
        self.prefix_queries = engine_wide(
            Counter, "prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache"
        )
        self.prefix_hits = engine_wide(
            Counter, "prefix_cache_hits_tokens", "Prompt tokens found in the prefix cache"
        )
        self.preemptions = engine_wide(Counter, "preemptions", "Sequences preempted")
        self.spec_proposed = engine_wide(
            Counter, "spec_proposed_tokens", "Speculative draft tokens verified"
        )
        self.spec_accepted = engine_wide(
            Counter, "spec_accepted_tokens", "Speculative draft tokens accepted"
        )
