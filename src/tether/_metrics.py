"""Process-wide metrics in Prometheus terms (``GET /metrics``, docs/deploy.md "Metrics").

Counters and histograms are recorded where things happen (a run ends, a call
settles, a decision arrives, a store transaction ends, an answer is
``overloaded``, a webhook delivery fails); what the store holds (runs by
status, pauses and their age, outbox backlog, store size) and how busy the
sandbox pool is are read when scraped (:func:`render`). Labels carry only
bounded vocabularies — statuses, codes, kinds, outcomes — never run ids,
tool arguments or principals.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Reads the store at a scrape (tether._store.retention.live_counts, handed in: the store imports this module).
StoreReader = Callable[[Any, float], dict[str, Any]]

REGISTRY = CollectorRegistry(auto_describe=True)

RUNS_ENDED = Counter("tether_runs_ended", "Runs that ended in this process, by status and error code.",
                     ["status", "code"], registry=REGISTRY)
CALLS = Counter("tether_calls", "Host calls settled in this process, by kind (read, write, or the built-in) and "
                "outcome (the journal state).", ["kind", "outcome"], registry=REGISTRY)
# Seconds a person took: from the pause to the decision.
APPROVAL_SECONDS = Histogram("tether_approval_latency_seconds", "Time from a write's pause to its decision.",
                             registry=REGISTRY,
                             buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400))
OVERLOADED = Counter("tether_overloaded_answers", "Requests answered `overloaded` (no run slot or queue room).",
                     registry=REGISTRY)
STORE_SECONDS = Histogram("tether_store_call_seconds", "Store transactions, by read or write.", ["access"],
                          registry=REGISTRY,
                          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))
WEBHOOK_FAILURES = Counter("tether_webhook_failures", "Webhook delivery attempts that failed.", registry=REGISTRY)


# Each metric's child per label values, looked up once: ``labels()`` costs ~5 us (it takes a lock and
# builds the key) and runs for every call, store transaction and run end. The vocabularies are bounded.
_CHILDREN: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    child = _CHILDREN.get((id(metric), *values))
    if child is None:
        child = _CHILDREN[(id(metric), *values)] = metric.labels(*values)
    return child


def run_ended(status: str, error: dict[str, Any] | None) -> None:
    code = str((error or {}).get("code") or "") if status != "completed" else ""
    _child(RUNS_ENDED, str(status), code).inc()


def call_settled(op: str, kind: str, outcome: str) -> None:
    _child(CALLS, kind if op == "tool" else op, str(outcome)).inc()


class _Live(Collector):
    """What is true now: read from the store and the pool at each scrape."""

    def __init__(self, rt: Any, read_store: StoreReader) -> None:
        self.rt, self.read_store = rt, read_store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pool = self.rt.engine.pool
        workers = GaugeMetricFamily("tether_sandbox_workers", "Sandbox workers by state (this process).",
                                    labels=["state"])
        workers.add_metric(["busy"], pool.busy)
        workers.add_metric(["idle"], max(0, pool.max_workers - pool.busy))
        yield workers
        now = self.rt.engine.clock()
        live = self.read_store(self.rt.store, now)
        runs = GaugeMetricFamily("tether_runs", "Runs in the store, by status.", labels=["status"])
        for status, n in live["runs_by_status"].items():
            runs.add_metric([status], n)
        yield runs
        pending = GaugeMetricFamily("tether_pauses_pending", "Runs paused for a person or waiting on a wait, "
                                    "signal or timer.", labels=["status"])
        oldest = GaugeMetricFamily("tether_pause_oldest_age_seconds", "Age of the oldest pause, by status.",
                                   labels=["status"])
        for status in ("paused", "waiting"):
            n, since = live["pauses"].get(status, (0, None))
            pending.add_metric([status], n)
            oldest.add_metric([status], max(0.0, now - since) if since is not None else 0.0)
        yield pending
        yield oldest
        yield GaugeMetricFamily("tether_outbox_backlog", "Webhook deliveries not yet made.",
                                value=live["outbox_pending"])
        yield GaugeMetricFamily("tether_store_size_bytes", "The store's size on disk.", value=live["size_bytes"])


def render(rt: Any, read_store: StoreReader) -> bytes:
    """The Prometheus text exposition: this process's counters and what is live now (a Runtime's pool and
    store). Blocking: it reads the store."""
    live = CollectorRegistry(auto_describe=False)
    live.register(_Live(rt, read_store))
    return generate_latest(REGISTRY) + generate_latest(live)


class timed_store_call:
    """Observe one store transaction's duration (a context manager cheaper than a decorator per call)."""

    __slots__ = ("access", "t")

    def __init__(self, write: bool) -> None:
        self.access = "write" if write else "read"

    def __enter__(self) -> None:
        self.t = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        _child(STORE_SECONDS, self.access).observe(time.perf_counter() - self.t)


__all__ = ["REGISTRY", "render", "run_ended", "call_settled"]
