"""P-31 under real crashes: the crash matrix against an API that dedupes by idempotency key.

The runtime runs in a child process that is SIGKILLed at each seam and at
random moments (tests/crash/child.py, as in test_crash.py); its tools come
from the OpenAPI document of tests/fixtures/keyed_api.py, a payments API in
its own process whose ledger records every charge that took effect and every
request it received.

- key declared (idempotency = "key"): every run completes, every charge takes
  effect exactly once, and no write ends write_outcome_unknown — a write whose
  outcome the kill lost is re-sent with its key and the API replays it.
- key undeclared: today's guarantees, unchanged: no request is ever sent
  twice, and a run ends completed or failed with a named error.

The ledger counts of both matrices are printed at the end of the test run.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from helpers import KeyedApi
from test_crash import NAMED_FAILURES, run_trial

pytestmark = pytest.mark.slow

ORDERS = {f"order-{i}" for i in range(1, 7)}
SEAMS = [
    ("record", 1), ("record", 9),
    ("sending", 1), ("sending", 3),
    ("delivered", 1), ("delivered", 4),
    ("outcome", 3), ("outcome", 10),
    ("snapshot", 1), ("snapshot", 2),
]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = KeyedApi(tmp_path_factory.mktemp("keyed_crash"))
    yield server
    server.stop()


def trial(tmp_path, api: KeyedApi, mode: str, name: str, **kw):
    """One run killed as ``kw`` says and recovered; what the journal and the API's ledger say."""
    killed, _, runs, calls = run_trial(tmp_path, (api.url, api.ledger), name, env={"CRASH_API": mode}, **kw)
    mine = {f"tether-{run.run_id}-" for run in runs}
    ours = lambda rows: [r for r in rows if r["key"] and r["key"].startswith(tuple(mine))]  # noqa: E731
    requests, effects = ours(api.requests()), ours(api.effects())
    for run in runs:
        assert run.status in ("completed", "failed"), run.status
        if run.status == "failed":
            assert run.error["code"] in NAMED_FAILURES, run.error
        if run.status == "completed":
            assert run.result["result"] == {"total": 210, "last": "order-6"}
    # Every request carried the key its write's journal entry records.
    journaled = {c.idempotency_key: c for run in runs for c in calls[run.run_id] if c.kind == "write"}
    assert {q["key"] for q in requests} <= set(journaled)
    return killed, runs, journaled, Counter(q["key"] for q in requests), Counter(e["order"] for e in effects)


def report(ledger_report, matrix: str, killed: bool, runs, requests: Counter, effects: Counter) -> None:
    ends = Counter(r.status if r.status == "completed" else r.error["code"] for r in runs)
    ledger_report(matrix, runs=len(runs), killed=int(killed), **ends, requests=sum(requests.values()),
                  effects=sum(effects.values()), replayed=sum(requests.values()) - sum(effects.values()))


def check_declared(runs, journaled, requests: Counter, effects: Counter) -> None:
    for run in runs:
        assert run.status == "completed", run.error  # never write_outcome_unknown
    if runs:
        assert effects == Counter(ORDERS), f"effects per order: {dict(effects)}"  # each exactly once
    assert all(c.state == "sent" for c in journaled.values())
    # Every send was journaled before it left (one killed right after may never have left).
    assert all(journaled[k].sends >= n for k, n in requests.items())


def check_undeclared(runs, requests: Counter, effects: Counter) -> None:
    assert all(n == 1 for n in requests.values()), f"sent twice: {dict(requests)}"
    assert all(n == 1 for n in effects.values()), f"took effect twice: {dict(effects)}"
    for run in runs:
        if run.status == "completed":
            assert set(effects) == ORDERS


@pytest.mark.parametrize("seam, n", SEAMS)
def test_p31_key_declared_kill_at_each_seam_every_write_takes_effect_once(tmp_path, api, seam, n, ledger_report):
    killed, runs, journaled, requests, effects = trial(tmp_path, api, "declared", f"{seam}{n}", kill_at=f"{seam}:{n}")
    assert killed, "the kill point was not reached"
    report(ledger_report, "crash matrix, key declared, each seam", killed, runs, requests, effects)
    check_declared(runs, journaled, requests, effects)
    if seam == "delivered":
        # The API took the charge, the journal never heard: the re-send was a replay.
        assert max(requests.values()) == 2


@pytest.mark.parametrize("seam, n", SEAMS)
def test_p31_key_undeclared_kill_at_each_seam_keeps_todays_guarantees(tmp_path, api, seam, n, ledger_report):
    killed, runs, journaled, requests, effects = trial(tmp_path, api, "undeclared", f"{seam}{n}",
                                                       kill_at=f"{seam}:{n}")
    assert killed, "the kill point was not reached"
    report(ledger_report, "crash matrix, key undeclared, each seam", killed, runs, requests, effects)
    check_undeclared(runs, requests, effects)
    (run,) = runs
    if seam in ("sending", "delivered"):
        assert run.status == "failed" and run.error["code"] == "write_outcome_unknown"


@pytest.mark.parametrize("mode", ["declared", "undeclared"])
def test_p31_random_kill_points(tmp_path, api, mode, ledger_report):
    rng = random.Random(int(os.environ.get("TETHER_CRASH_SEED", "1234")))
    timing: dict = {}
    trial(tmp_path, api, mode, "calibrate", timing=timing)
    mid_run = 0
    for i in range(12):
        killed, runs, journaled, requests, effects = trial(tmp_path, api, mode, f"random{i}",
                                                           kill_after=rng.uniform(0, timing["span"]))
        report(ledger_report, f"crash matrix, key {mode}, random kill points", killed, runs, requests, effects)
        if mode == "declared":
            check_declared(runs, journaled, requests, effects)
        else:
            check_undeclared(runs, requests, effects)
        mid_run += killed and bool(runs)
    # Most kill points must land inside the run, or this shows nothing.
    assert mid_run >= 6
