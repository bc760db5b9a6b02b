"""P-11: a crash test that really kills.

The runtime runs in a child process and is SIGKILLed at each seam (after a
call is journaled, after a write is marked sending, after an outcome, after a
snapshot) and at random moments; a fresh process recovers the run. The tool
server is a separate process that counts deliveries. Across every kill: no
write is delivered twice, and every run ends completed, or failed with a
named error.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tether._store import open_store

HERE = Path(__file__).parent.parent / "crash"
PY = sys.executable
NAMED_FAILURES = {"write_outcome_unknown", "execution_diverged"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shop")
    ledger, port_file = tmp / "ledger.jsonl", tmp / "port"
    proc = subprocess.Popen([PY, str(HERE / "delivery_server.py"), str(ledger), str(port_file)])
    deadline = time.monotonic() + 10
    while not port_file.exists():
        assert time.monotonic() < deadline, "delivery server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port_file.read_text()}", ledger
    proc.kill()
    proc.wait()


def _run_started(store_url: str) -> bool:
    path = store_url[len("sqlite:///"):]
    if not os.path.exists(path):
        return False
    try:
        store = open_store(store_url)
        try:
            return bool(store.list_runs())
        finally:
            store.close()
    except Exception:
        return False


def child(store_url: str, server_url: str, mode: str, kill_at: str | None = None, kill_after: float | None = None,
          timing: dict | None = None, env: dict | None = None):
    args = [PY, str(HERE / "child.py"), store_url, server_url, mode] + ([kill_at] if kill_at else [])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    if kill_after is not None or timing is not None:
        # Time kill points from the moment the run exists, not from process start.
        while proc.poll() is None and not _run_started(store_url):
            time.sleep(0.002)
        started = time.monotonic()
        if kill_after is not None:
            try:
                proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        else:
            proc.wait()
            timing["span"] = time.monotonic() - started
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def deliveries(ledger: Path, prefix: str) -> Counter:
    if not ledger.exists():
        return Counter()
    return Counter(order for order in charges(ledger) if order.startswith(prefix))


def charges(ledger: Path) -> list[str]:
    """The orders the delivery server charged, in order; its refund lines (the rollback tests') are not charges."""
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    return [line["order"] for line in lines if "order" in line]


def run_trial(tmp_path, server, name: str, kill_at: str | None = None, kill_after: float | None = None,
              timing: dict | None = None, env: dict | None = None):
    server_url, ledger = server
    db = tmp_path / f"{name}.db"
    store_url = f"sqlite:///{db}"
    code, out, err = child(store_url, server_url, "start", kill_at, kill_after, timing, env)
    killed = code == -signal.SIGKILL
    final = None
    if not killed:
        assert code == 0, err
        final = json.loads(out)[0]
    # Recover until no run is left running (a lease outlives its process by up to 0.3 s).
    for _ in range(5):
        store = open_store(store_url)
        runs = store.list_runs()
        store.close()
        if not runs or all(r.status != "running" for r in runs):
            break
        time.sleep(0.4)
        code, out, err = child(store_url, server_url, "recover", env=env)
        assert code == 0, err
    store = open_store(store_url)
    runs = store.list_runs()
    calls = {r.run_id: store.get_calls(r.run_id) for r in runs}
    store.close()
    return killed, final, runs, calls


def check(runs, calls, ledger: Path):
    delivered = Counter(charges(ledger)) if ledger.exists() else Counter()
    # Orders are the same across trials: count only this trial's deliveries,
    # which the journal names (sent or unknown).
    for run in runs:
        assert run.status in ("completed", "failed"), run.status
        if run.status == "failed":
            assert run.error["code"] in NAMED_FAILURES, run.error
        if run.status == "completed":
            assert run.result["result"] == {"total": 210, "last": "order-6"}
        writes = [c for c in calls[run.run_id] if c.kind == "write"]
        sent = [c for c in writes if c.state == "sent"]
        assert len({c.args["order"] for c in sent}) == len(sent)  # journaled as sent once each
    return delivered


@pytest.mark.parametrize("seam, n", [
    ("record", 1), ("record", 4), ("record", 9),
    ("sending", 1), ("sending", 3),
    ("outcome", 2), ("outcome", 3), ("outcome", 10),
    ("snapshot", 1), ("snapshot", 2),
])
def test_p11_kill_at_each_seam_never_delivers_a_write_twice(tmp_path, server, seam, n):
    _, ledger = server
    before = deliveries(ledger, "order-")
    killed, final, runs, calls = run_trial(tmp_path, server, f"{seam}{n}", kill_at=f"{seam}:{n}")
    assert killed, "the kill point was not reached"
    check(runs, calls, ledger)
    after = deliveries(ledger, "order-")
    new = after - before
    assert all(v == 1 for v in new.values()), f"delivered twice: {new}"
    (run,) = runs
    if run.status == "completed":
        assert set(new) == {f"order-{i}" for i in range(1, 7)}
    if seam == "sending":
        assert run.status == "failed" and run.error["code"] == "write_outcome_unknown"
        assert f"call {run.error['details']['seq']}" in run.error["message"]


def test_p11_random_kill_points_never_deliver_a_write_twice(tmp_path, server):
    _, ledger = server
    rng = random.Random(int(os.environ.get("TETHER_CRASH_SEED", "1234")))
    # Calibrate on this machine: how long one unkilled start takes. The
    # fastest of three, so that a slow first start on a loaded machine does
    # not push most kill points past the end of the run.
    spans = []
    for k in range(3):
        timing: dict = {}
        run_trial(tmp_path, server, f"calibrate{k}", timing=timing)
        spans.append(timing["span"])
    span = min(spans)
    outcomes = Counter()
    for i in range(20):
        before = deliveries(ledger, "order-")
        killed, final, runs, calls = run_trial(tmp_path, server, f"random{i}", kill_after=rng.uniform(0, span))
        check(runs, calls, ledger)
        new = deliveries(ledger, "order-") - before
        assert all(v == 1 for v in new.values()), f"trial {i}: delivered twice: {new}"
        for run in runs:
            outcomes[run.status if run.status == "completed" else run.error["code"]] += 1
        outcomes["killed" if killed else "not killed"] += 1
        if killed and runs:
            outcomes["killed mid-run"] += 1
    print("random kill outcomes:", dict(outcomes))
    # Most kill points must land inside the run, or this shows nothing.
    assert outcomes["killed mid-run"] >= 10, dict(outcomes)


# -- P-46: a rollback killed at each of its seams, then taken over ------------------------------------------

UNDO_ENV = {"CRASH_PROGRAM": "undo"}


def refunds(ledger: Path, run_id: str) -> tuple[Counter, Counter]:
    """(deliveries, effects) of the refunds run ``run_id``'s rollback sent, by order."""
    lines = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    mine = [x for x in lines if "refund" in x and f"-{run_id}-" in x["key"]]
    return Counter(x["refund"] for x in mine), Counter(x["refund"] for x in mine if x["applied"])


@pytest.mark.parametrize("seam, n", [
    ("rollback", 1),
    ("record", 1), ("record", 3),
    ("sending", 1), ("sending", 2), ("sending", 3),
    ("delivered", 1), ("delivered", 3),
    ("outcome", 1), ("outcome", 2), ("outcome", 3),
])
def test_p46_a_rollback_killed_at_each_seam_then_taken_over_undoes_each_write_once(tmp_path, server, seam, n):
    server_url, ledger = server
    store_url = f"sqlite:///{tmp_path / 'undo.db'}"
    code, out, err = child(store_url, server_url, "start", env=UNDO_ENV)
    assert code == 0, err
    (paused,) = json.loads(out)
    assert paused["status"] == "paused" and paused["pending"]["address"] == "shop.transfer"

    code, out, err = child(store_url, server_url, "undo", f"{seam}:{n}", env=UNDO_ENV)
    assert code == -signal.SIGKILL, f"the kill point was not reached: {code} {err[-2000:]}"
    for _ in range(5):  # a fresh process takes the rollback over and finishes it
        store = open_store(store_url)
        (run,) = store.list_runs()
        store.close()
        if run.status != "running":
            break
        time.sleep(0.4)
        code, out, err = child(store_url, server_url, "recover", env=UNDO_ENV)
        assert code == 0, err

    store = open_store(store_url)
    (run,) = store.list_runs()
    calls = store.get_calls(run.run_id)
    store.close()
    assert run.status == "rolled_back", (run.status, run.error)
    delivered, applied = refunds(ledger, run.run_id)
    # Each undo took effect exactly once, whatever was re-sent by its key (P-31).
    assert applied == Counter({"undo-1": 1, "undo-2": 1, "undo-3": 1}), (delivered, applied)
    if seam == "delivered":  # it had arrived when the process died: sent again by its key, taking effect once
        assert delivered[f"undo-{4 - n}"] == 2, delivered
    else:
        assert set(delivered.values()) == {1}, delivered
    undos = [c for c in calls if c.op == "undo"]
    assert [(c.args["order"], c.state) for c in undos] == [
        ("undo-3", "sent"), ("undo-2", "sent"), ("undo-1", "sent")]
    assert [x["undone"] for x in run.result["rollback"]] == [True, True, True]
    transfer = next(c for c in calls if c.address == "shop.transfer")
    assert transfer.state == "declined" and transfer.error["message"].startswith("[write_rolled_back]")


@pytest.mark.parametrize("seam", ["sending", "delivered"])
def test_p46_an_undo_left_sending_to_a_tool_that_does_not_dedupe_is_unknown_and_never_sent_again(tmp_path, server,
                                                                                                   seam):
    server_url, ledger = server
    env = {**UNDO_ENV, "CRASH_UNDO_UNKEYED": "1"}
    store_url = f"sqlite:///{tmp_path / 'undo.db'}"
    code, out, err = child(store_url, server_url, "start", env=env)
    assert code == 0, err
    code, out, err = child(store_url, server_url, "undo", f"{seam}:1", env=env)
    assert code == -signal.SIGKILL, f"the kill point was not reached: {code} {err[-2000:]}"
    time.sleep(0.4)
    code, out, err = child(store_url, server_url, "recover", env=env)
    assert code == 0, err
    store = open_store(store_url)
    (run,) = store.list_runs()
    store.close()
    assert run.status == "rolled_back", (run.status, run.error)
    delivered, _ = refunds(ledger, run.run_id)
    # At most once: the lost undo is not sent again (P-8, P-11); the others are sent once each.
    assert delivered["undo-3"] == (1 if seam == "delivered" else 0)
    assert delivered["undo-2"] == delivered["undo-1"] == 1
    first = run.result["rollback"][0]
    assert first["seq"] == 3 and not first["undone"] and first["undo"]["state"] == "unknown"
    assert "outcome is unknown" in first["why"] and "not undone: call 3 shop.charge" in run.error["message"]


# -- D-80: gathered calls in flight at each seam, with the sandbox's streamed async calls on and off ----------

@pytest.mark.parametrize("stream", ["1", "0"], ids=["streamed", "suspended"])
@pytest.mark.parametrize("seam, n", [
    ("record", 1), ("record", 3), ("sending", 2), ("outcome", 2), ("outcome", 5), ("snapshot", 1),
])
def test_p11_p13_gathered_writes_killed_at_each_seam_recover_to_the_journal_and_deliver_once(tmp_path, server, seam,
                                                                                             n, stream):
    _, ledger = server

    def orders() -> Counter:  # the shared ledger also holds the rollback tests' refunds, which have no order
        lines = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
        return Counter(x["order"] for x in lines if str(x.get("order", "")).startswith("order-"))

    env = {"CRASH_PROGRAM": "gather", "CRASH_STREAM": stream}
    before = orders()
    killed, final, runs, calls = run_trial(tmp_path, server, f"g{stream}{seam}{n}", kill_at=f"{seam}:{n}", env=env)
    assert killed, "the kill point was not reached"
    new = orders() - before
    assert all(v == 1 for v in new.values()), f"delivered twice: {new}"
    (run,) = runs
    # The recovery replayed or restored to the journal: a gathered read missing below a recorded write (its
    # intent still in memory when the process died) is issued again, not read as divergence (D-80).
    assert run.status == "completed" or run.error["code"] == "write_outcome_unknown", run.error
    if run.status == "completed":
        assert run.result["result"] == {"total": 210, "last": "order-6"}
        assert set(new) == {f"order-{i}" for i in range(1, 7)}
    journal = calls[run.run_id]
    if run.status == "completed":
        assert [c.seq for c in journal] == list(range(1, 19))
    sent = [c.args["order"] for c in journal if c.kind == "write" and c.state == "sent"]
    assert len(set(sent)) == len(sent) and set(sent) <= set(new)


# -- P-52: each order in a task of its own, killed mid-task at each seam, streamed calls on and off --------------

@pytest.mark.parametrize("stream", ["1", "0"], ids=["streamed", "suspended"])
@pytest.mark.parametrize("seam, n", [("record", 1), ("record", 3), ("sending", 2), ("outcome", 4), ("snapshot", 1)])
def test_p52_p11_tasks_killed_mid_task_at_each_seam_recover_and_deliver_each_write_once(tmp_path, server, seam, n,
                                                                                      stream):
    _, ledger = server

    def orders() -> Counter:  # the shared ledger also holds the rollback tests' refunds, which have no order
        lines = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
        return Counter(x["order"] for x in lines if str(x.get("order", "")).startswith("order-"))

    env = {"CRASH_PROGRAM": "tasks", "CRASH_STREAM": stream}
    before = orders()
    killed, final, runs, calls = run_trial(tmp_path, server, f"t{stream}{seam}{n}", kill_at=f"{seam}:{n}", env=env)
    assert killed, "the kill point was not reached"
    new = orders() - before
    assert all(v == 1 for v in new.values()), f"delivered twice: {new}"
    (run,) = runs
    # A replay answers reads at once, so tasks may issue their later calls in another order than the journal
    # holds: each is matched to its entry by key (P-52); one the journal and the snapshot lack, issued where
    # another call's entry stands, is still divergence, with nothing sent after it (P-6, D-85).
    assert run.status == "completed" or run.error["code"] in ("write_outcome_unknown", "execution_diverged"), \
        run.error
    journal = calls[run.run_id]
    sent = [c.args["order"] for c in journal if c.kind == "write" and c.state == "sent"]
    assert len(set(sent)) == len(sent) and set(sent) <= set(new)
    if run.status == "completed":
        assert run.result["result"] == {"total": 210, "last": "order-6"}
        assert set(new) == {f"order-{i}" for i in range(1, 7)}
        assert [c.seq for c in journal] == list(range(1, 13))
    elif run.error["code"] == "write_outcome_unknown":
        # Tasks send their writes concurrently: whatever the seam, another task's write may be on the wire when
        # the process dies. Each such write is unknown and was not sent again (P-11); the run names one.
        unknown = [c for c in journal if c.state == "unknown"]
        assert unknown and run.error["details"]["seq"] in {c.seq for c in unknown}
        assert all(new[c.args["order"]] <= 1 for c in unknown)
