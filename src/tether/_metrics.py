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

import bisect
import os
import threading
import time
from typing import Any, Callable, Iterator

# Reads the store at a scrape (tether._store.retention.live_counts, handed in: the store imports this module).
StoreReader = Callable[[Any, float], dict[str, Any]]

# The counters and histograms are kept here, in plain numbers, and handed to prometheus_client only at a
# scrape (render): importing it (with http.server, http.client and email, which it imports for its own
# exporter) cost every cold `tether run` ~25 ms of CPU, for metrics that only a serving process exposes
# (tests/shape/test_cold_imports.py; sources_bench). The exposition is the one prometheus_client's own Counter
# and Histogram write: the same families, samples, `le` buckets and `_created` series.


class _Child:
    """One label combination's value: a count, or a histogram's bucket counts and sum."""

    __slots__ = ("family", "value", "counts", "created")

    def __init__(self, family: _Family) -> None:
        self.family = family
        self.value = 0.0
        self.counts = [0] * (len(family.buckets) + 1) if family.buckets is not None else []
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        with self.family.lock:
            self.value += amount

    def observe(self, amount: float) -> None:
        # le buckets: the first bound at or above the value; past the last, +Inf.
        i = bisect.bisect_left(self.family.buckets or (), amount)
        with self.family.lock:
            self.counts[i] += 1
            self.value += amount


class _Family:
    """A counter (no ``buckets``) or a histogram: its children by label values."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...] = (),
                 buckets: tuple[float, ...] | None = None) -> None:
        self.name, self.documentation, self.labelnames, self.buckets = name, documentation, labelnames, buckets
        self.lock = threading.Lock()
        self.children: dict[tuple[str, ...], _Child] = {}
        if not labelnames:  # shown from the start, at 0, as prometheus_client shows an unlabelled metric
            self.children[()] = _Child(self)

    def labels(self, *values: str) -> _Child:
        child = self.children.get(values)
        if child is None:
            with self.lock:
                child = self.children.setdefault(values, _Child(self))
        return child

    def inc(self, amount: float = 1.0) -> None:
        self.children[()].inc(amount)

    def observe(self, amount: float) -> None:
        self.children[()].observe(amount)


FAMILIES: list[_Family] = []


def _counter(name: str, documentation: str, labelnames: tuple[str, ...] = ()) -> _Family:
    FAMILIES.append(family := _Family(name, documentation, labelnames))
    return family


def _histogram(name: str, documentation: str, buckets: tuple[float, ...], labelnames: tuple[str, ...] = ()) -> _Family:
    FAMILIES.append(family := _Family(name, documentation, labelnames, buckets))
    return family


RUNS_ENDED = _counter("tether_runs_ended", "Runs that ended in this process, by status and error code.",
                      ("status", "code"))
CALLS = _counter("tether_calls", "Host calls settled in this process, by kind (read, write, or the built-in) and "
                 "outcome (the journal state).", ("kind", "outcome"))
# Seconds a person took: from the pause to the decision.
APPROVAL_SECONDS = _histogram("tether_approval_latency_seconds", "Time from a write's pause to its decision.",
                              (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400))
OVERLOADED = _counter("tether_overloaded_answers", "Requests answered `overloaded` (no run slot or queue room).")
STORE_SECONDS = _histogram("tether_store_call_seconds", "Store transactions, by read or write.",
                           (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5), ("access",))
WEBHOOK_FAILURES = _counter("tether_webhook_failures", "Webhook delivery attempts that failed.")


# Each metric's child per label values, looked up once (one dict lookup, no lock, on every call, store
# transaction and run end). The vocabularies are bounded.
_CHILDREN: dict[tuple[Any, ...], _Child] = {}


def _child(metric: _Family, *values: str) -> _Child:
    child = _CHILDREN.get((id(metric), *values))
    if child is None:
        child = _CHILDREN[(id(metric), *values)] = metric.labels(*values)
    return child


def run_ended(status: str, error: dict[str, Any] | None) -> None:
    code = str((error or {}).get("code") or "") if status != "completed" else ""
    _child(RUNS_ENDED, str(status), code).inc()


# Host calls' children by (op, kind, outcome) as given: looked up on every host call, with no key built.
_CALL_CHILDREN: dict[tuple[str, str, str], _Child] = {}


def call_settled(op: str, kind: str, outcome: str) -> None:
    child = _CALL_CHILDREN.get((op, kind, outcome))
    if child is None:
        child = _CALL_CHILDREN[(op, kind, outcome)] = _child(CALLS, kind if op == "tool" else op, str(outcome))
    child.inc()


class _Recorded:
    """The counters and histograms above, as prometheus_client's families (a collector, at a scrape)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
        from prometheus_client.samples import Sample
        from prometheus_client.utils import floatToGoString

        # prometheus_client's own switch for the _created series.
        created = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() != "true"
        for family in FAMILIES:
            with family.lock:
                children = [(values, c.value, list(c.counts), c.created) for values, c in family.children.items()]
            if family.buckets is None:
                counter = CounterMetricFamily(family.name, family.documentation, labels=family.labelnames)
                for values, value, _, since in children:
                    counter.add_metric(values, value, created=since if created else None)
                yield counter
                continue
            histogram = HistogramMetricFamily(family.name, family.documentation, labels=family.labelnames)
            bounds = [floatToGoString(b) for b in family.buckets] + ["+Inf"]
            for values, total, counts, since in children:
                running, buckets = 0, []
                for bound, n in zip(bounds, counts):
                    running += n
                    buckets.append((bound, float(running)))
                histogram.add_metric(values, buckets, total)
                if created:
                    histogram.samples.append(Sample(family.name + "_created", dict(zip(family.labelnames, values)),
                                                    since))
            yield histogram


class _Live:
    """What is true now: read from the store and the pool at each scrape."""

    def __init__(self, rt: Any, read_store: StoreReader) -> None:
        self.rt, self.read_store = rt, read_store

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

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
    from prometheus_client import CollectorRegistry, generate_latest

    recorded, live = CollectorRegistry(auto_describe=False), CollectorRegistry(auto_describe=False)
    recorded.register(_Recorded())
    live.register(_Live(rt, read_store))
    return generate_latest(recorded) + generate_latest(live)


class timed_store_call:
    """Observe one store transaction's duration (a context manager cheaper than a decorator per call)."""

    __slots__ = ("access", "t")

    def __init__(self, write: bool) -> None:
        self.access = "write" if write else "read"

    def __enter__(self) -> None:
        self.t = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        _child(STORE_SECONDS, self.access).observe(time.perf_counter() - self.t)


__all__ = ["render", "run_ended", "call_settled"]
