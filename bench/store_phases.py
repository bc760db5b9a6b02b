"""What a warm 10-call read-only execute asks of its SQLite store, per phase (issue 24, session 7).

Not a benchmark run by run_all.py: a probe kept so bench/README.md's "Issue 24, session 7: the SQLite
store's share" can be taken again. Wrappers put around the functions from outside (no source edited, no
profiler; a wrapper costs ~0.3 µs a call) stamp ``time.perf_counter_ns`` on entry and exit and sum the time
per execute; each phase's p50 over the executes is printed, for the SQLite file store and the in-memory one,
with the store's own counts (``store.traffic``: transactions and statements a run) and how many column
values the store encoded as JSON.

Phases (nested ones are part of the one above them):

* ``create``: ``Lifecycle.create``, the run's row (transaction 1);
* ``end``: ``Finisher.end_attempt``, the journal's held reads signed and written with the run's end
  (transaction 2, D-49) — of which ``envelope``: ``RunResult.to_dict``; ``write_with``: ``Ledger.write_with``,
  of which ``sign``: the entries' MACs (``integrity.sign_call``) and ``finish``: ``Lifecycle.finish``, of which
  ``store.end_run``: the store method, of which ``rows``: the journal batch's rows and SQL built
  (``_call_inserts``, their encodes included), ``run update``: the end's ``UPDATE`` built (``_run_update``, the
  envelope's encode included); ``encode``: the column values' JSON (the store's column encoder, both
  transactions) and ``sql``: the statements themselves (``Tx.run``, ``Tx.run_many``), ``begin`` / ``commit``:
  SQLite's ``BEGIN`` and ``COMMIT`` (the backend's ``_begin``, both transactions); what is left of ``store.*`` is
  the lock, the metrics and the counting;
* ``flush``: ``store.record_calls`` (a journal batch written apart from the end: none on a quick run).

    python bench/store_phases.py [--runs 400] [--calls 10] [--stores file,memory] [--args-texts]
    python bench/store_phases.py --statements [--runs 400]   # the batch's SQL: multi-row INSERT or executemany
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import importlib
import inspect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import common
import tether
import tether._engine.integrity as integrity
import tether._store._schema as schema
import tether._store.sqlite as sqlite_store
from tether._engine.attempt.result import RunResult
from tether._engine.calls.ledger import Ledger
from tether._engine.finish import Finisher
from tether._engine.lifecycle import Lifecycle
from tether._runtime import Runtime
from tether._store import open_store

_sums: collections.Counter[str] = collections.Counter()
_within = [""]  # the store method being timed, to which an encode is charged


def _wrap(owner: Any, name: str, phase: str, counted: bool = False) -> Callable[[], None]:
    """Put a timing wrapper around ``owner.name``; returns what takes it off again."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    fn = original.__func__ if isinstance(original, staticmethod) else original
    perf = time.perf_counter_ns
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            t = perf()
            try:
                return await fn(*args, **kwargs)
            finally:
                _sums[phase] += perf() - t
        wrapper: Any = timed_async
    else:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            outer, _within[0] = _within[0], phase
            t = perf()
            try:
                return fn(*args, **kwargs)
            finally:
                took = perf() - t
                _sums[phase] += took
                _within[0] = outer
                if counted:
                    _sums[phase + " (count)"] += 1
                if phase == "sql":  # the statements of the end's transaction apart from the start's
                    _sums[f"sql in {outer}"] += took
        wrapper = timed
    setattr(owner, name, staticmethod(wrapper) if isinstance(original, staticmethod) else wrapper)
    return lambda: setattr(owner, name, original)


class _CountingEncoder(json.JSONEncoder):
    """The store's column encoder, each encode timed, counted and charged to the store method running it."""

    def encode(self, o: Any) -> str:
        t = time.perf_counter_ns()
        try:
            return super().encode(o)
        finally:
            _sums["encode"] += time.perf_counter_ns() - t
            _sums["encode (count)"] += 1
            _sums[f"encode in {_within[0]} (count)"] += 1


def _rows_module() -> Any:
    """Where the column encoder lives: ``_store/_rows.py``, or ``_schema.py`` in a tree from before the split."""
    try:
        return importlib.import_module("tether._store._rows")
    except ImportError:
        return schema


def _begin_timed(original: Callable[..., Any]) -> Callable[..., Any]:
    """The backend's ``_begin``: ``BEGIN`` (to the yield) and ``COMMIT`` (after it) timed apart."""
    perf = time.perf_counter_ns

    @contextlib.contextmanager
    def begin(self: Any, conn: Any, write: bool, *rest: Any) -> Iterator[Any]:
        t = perf()
        cm = original(self, conn, write, *rest)
        tx = cm.__enter__()
        _sums["begin"] += perf() - t
        try:
            yield tx
        except BaseException:
            if not cm.__exit__(*sys.exc_info()):
                raise
            return
        t = perf()
        cm.__exit__(None, None, None)
        _sums["commit"] += perf() - t
    return begin


PHASES = ["execute", "create", "store.create_run", "end", "envelope", "write_with", "sign", "finish", "store.end_run",
          "rows", "run update", "encode", "sql", "sql in store.end_run", "begin", "commit", "flush"]


def _hand_args_texts() -> Callable[[], None]:
    """What the call boundary's side is to do (issue 24, the percall helper's): hand the arguments' canonical
    text to the ledger with the intent, as it does the result's. Simulated here by encoding them at
    ``buffer_intent`` (outside the store's phases), to show what the store's side takes."""
    from tether._engine.calls.call import canonical_json
    from tether._engine.calls.ledger import Ledger

    original = Ledger.buffer_intent

    def buffer_intent(self: Any, call: Any) -> None:
        original(self, call)
        self._texts.setdefault(call.seq, {})["args"] = (call.args, canonical_json(call.args))

    Ledger.buffer_intent = buffer_intent  # type: ignore[method-assign]
    return lambda: setattr(Ledger, "buffer_intent", original)


async def _measure(url: str, calls: int, runs: int, args_texts: bool) -> tuple[dict[str, Any], dict[str, float]]:
    code = common.PROGRAM.replace(f"range({common.CALLS})", f"range({calls})")
    undo = [_hand_args_texts()] if args_texts else []
    undo += [
        _wrap(Lifecycle, "create", "create"),
        _wrap(schema.SQLStore, "create_run", "store.create_run"),
        _wrap(Finisher, "end_attempt", "end"),
        _wrap(RunResult, "to_dict", "envelope"),
        _wrap(Ledger, "write_with", "write_with"),
        _wrap(Lifecycle, "finish", "finish"),
        _wrap(integrity, "sign_call", "sign", counted=True),
        _wrap(schema.SQLStore, "end_run", "store.end_run"),
        _wrap(schema.SQLStore, "record_calls", "flush", counted=True),
        _wrap(schema.Tx, "run", "sql", counted=True),
    ]
    for name, phase in (("_call_inserts", "rows"), ("_run_update", "run update")):
        if hasattr(schema, name):  # the journal rows built (encodes included); the end's UPDATE built
            undo.append(_wrap(schema, name, phase))
    if hasattr(schema.Tx, "run_many"):  # a batch run once per row (SQLite, session 7)
        undo.append(_wrap(schema.Tx, "run_many", "sql", counted=True))
    rows = _rows_module()
    original_encoder, original_begin = rows._JSON_COLUMN, sqlite_store.SQLiteStore._begin
    rows._JSON_COLUMN = _CountingEncoder(sort_keys=True, separators=(",", ":"))
    sqlite_store.SQLiteStore._begin = _begin_timed(original_begin)  # type: ignore[method-assign]
    per_run: dict[str, list[float]] = collections.defaultdict(list)
    traffic: dict[str, list[int]] = collections.defaultdict(list)
    try:
        store = open_store(url)
        async with Runtime(tools=common.bench_tools(), store=store) as rt:
            for _ in range(30):
                assert (await rt.execute(code)).status == "completed"
            for _ in range(runs):
                _sums.clear()
                before = store.traffic.snapshot()
                t = time.perf_counter_ns()
                result = await rt.execute(code)
                _sums["execute"] += time.perf_counter_ns() - t
                after = store.traffic.snapshot()
                assert result.status == "completed", result
                for phase in PHASES:
                    per_run[phase].append(_sums[phase] / 1000)
                for count in ("sign", "encode", "encode in store.create_run", "encode in store.end_run", "sql",
                              "flush"):
                    traffic[f"{count} (count)"].append(_sums[f"{count} (count)"])
                for k in ("transactions", "statements"):
                    traffic[k].append(after[k] - before[k])
    finally:
        rows._JSON_COLUMN = original_encoder
        sqlite_store.SQLiteStore._begin = original_begin  # type: ignore[method-assign]
        for u in undo:
            u()
    return ({p: (statistics.median(v), statistics.fmean(v)) for p, v in per_run.items()},
            {k: statistics.median(v) for k, v in traffic.items()})


def _batch_statements(tmp: str, rounds: int) -> None:
    """The end's transaction on the file store written four ways, round-robin on four files: the journal batch
    as one multi-row ``INSERT`` (what the store does) or ``executemany`` of the one-row ``INSERT``, with and
    without migration 11's in-step trigger (D-48); then the 10-row ``INSERT`` prepared anew against cached."""
    import sqlite3

    from tether._store.base import CallRecord, RunRecord
    from tether._store.sqlite import SQLiteStore

    rows_mod = _rows_module()

    def run(i: int) -> RunRecord:
        return RunRecord(run_id=f"r{i}", status="running", program="x" * 200,  # type: ignore[arg-type]
                         environment={"seed": 7}, policy={"writes": "ask"}, limits={"host_calls": 50},
                         created_at=1.0, updated_at=1.0, principal="local", owner="me", lease_until=5.0)

    def batch(i: int) -> list[list[Any]]:
        calls = [CallRecord(f"r{i}", s, "tool", "bench.get", {"id": s}, "k" * 64, "read", "done",  # type: ignore[arg-type]
                            outcome={"id": s, "value": 2 * s}, started_at=1.0, finished_at=2.0,
                            idempotency_key="x" * 40, mac="m" * 90) for s in range(1, 11)]
        return [[rows_mod._encode(rows_mod.CALL_COLUMNS, n, getattr(c, n)) for n in rows_mod.CALL_COLUMNS]
                for c in calls]

    one = rows_mod._INSERT_CALL
    multi = rows_mod._insert_rows(one, len(rows_mod.CALL_COLUMNS), 10)
    ways = ["multi-row INSERT", "executemany", "multi-row, no trigger", "executemany, no trigger"]
    stores, times = {}, {w: [] for w in ways}
    for k, way in enumerate(ways):
        stores[way] = SQLiteStore(f"sqlite:///{tmp}/batch{k}.db", secret=b"k" * 32)
        if "no trigger" in way:
            stores[way]._connection().execute("DROP TRIGGER calls_identity_digest_in_step")
    for i in range(rounds):
        for way in ways[i % 4:] + ways[:i % 4]:
            store, rows = stores[way], batch(i)
            store.create_run(run(i))
            conn = store._connection()
            t = time.perf_counter_ns()
            conn.execute("BEGIN IMMEDIATE")
            if way.startswith("multi"):
                conn.execute(multi, [v for row in rows for v in row])
            else:
                conn.executemany(one, rows)
            conn.execute("UPDATE runs SET status = ?, updated_at = ? WHERE run_id = ?", ("completed", 2.0, f"r{i}"))
            conn.execute("COMMIT")
            times[way].append(time.perf_counter_ns() - t)
    print(f"the end's transaction, file store, 10-row batch, p50 of {rounds} (µs):")
    for way in ways:
        print(f"  {way:<26}{statistics.median(times[way]) / 1000:>8.1f}")
    prepared = {0: [], 1: []}
    path = stores[ways[0]].path
    conns = {0: sqlite3.connect(str(path), isolation_level=None, cached_statements=0),
             1: sqlite3.connect(str(path), isolation_level=None)}
    for i in range(rounds):
        values = [v for row in batch(rounds + i) for v in row]
        for k in (0, 1) if i % 2 else (1, 0):
            conns[k].execute("BEGIN IMMEDIATE")
            t = time.perf_counter_ns()
            conns[k].execute(multi, values)
            prepared[k].append(time.perf_counter_ns() - t)
            conns[k].execute("ROLLBACK")
    print(f"  the 10-row INSERT alone: prepared each time {statistics.median(prepared[0]) / 1000:.1f}, "
          f"cached {statistics.median(prepared[1]) / 1000:.1f}")
    for conn in conns.values():
        conn.close()
    for store in stores.values():
        store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=400)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--stores", default="file,memory")
    p.add_argument("--args-texts", action="store_true",
                   help="hand the arguments' texts to the ledger as the boundary is to (a tree with CallRecord.texts)")
    p.add_argument("--statements", action="store_true",
                   help="instead: the journal batch as one multi-row INSERT against executemany, and a prepare's cost")
    args = p.parse_args()
    if args.statements:
        with tempfile.TemporaryDirectory() as tmp:
            _batch_statements(tmp, args.runs)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.stores.split(","):
            url = f"sqlite:///{tmp}/phases.db" if kind == "file" else "sqlite:///:memory:"
            results[kind] = asyncio.run(_measure(url, args.calls, args.runs, args.args_texts))
    kinds = list(results)
    print(f"tether from {Path(tether.__file__).parent}")
    print(f"{args.calls}-call read-only execute, {args.runs} runs after 30 warm-up; per phase, µs (wall): p50, and the"
          " mean (which the rare slow commit — SQLite's WAL checkpoint — moves)")
    print(f"{'phase':<22}" + "".join(f"{k + ' p50':>14}{k + ' mean':>14}" for k in kinds))
    for phase in PHASES:
        print(f"{phase:<22}" + "".join(f"{results[k][0][phase][0]:>14.1f}{results[k][0][phase][1]:>14.1f}"
                                       for k in kinds))
    print("per execute (median):")
    for name in results[kinds[0]][1]:
        print(f"{name:<22}" + "".join(f"{results[k][1][name]:>12g}" for k in kinds))


if __name__ == "__main__":
    main()
