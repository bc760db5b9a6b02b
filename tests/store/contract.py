"""What the store contract suite (tests/store/test_store_{runs,journal,events,schema,concurrency}.py) shares:
the backend a test runs on, the records it writes, and values JSON must carry back unchanged. Its fixtures,
``backend`` and ``store``, are in tests/store/conftest.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tether._store import CallRecord, RunRecord, SnapshotRecord
from tether._store._schema import SQLStore
from tether._store.postgres import PostgresStore
from tether._store.sqlite import SQLiteStore


@dataclass
class Backend:
    kind: str
    url: str
    schema: str | None = None
    opened: list[SQLStore] = field(default_factory=list)

    def open(self, secret: bytes | None = None) -> SQLStore:
        store: SQLStore
        if self.kind == "sqlite":
            store = SQLiteStore(self.url, secret=secret)
        else:
            store = PostgresStore(self.url, secret=secret, schema=self.schema or "tether")
        self.opened.append(store)
        return store

    @property
    def spec(self) -> str:
        return json.dumps({"kind": self.kind, "url": self.url, "schema": self.schema})


def make_run(run_id: str = "r1", status: str = "paused", **overrides: Any) -> RunRecord:
    values: dict[str, Any] = dict(
        run_id=run_id,
        status=status,
        program="x = await tools.a.b(n=1)",
        environment={"clock": "2026-01-01T00:00:00+00:00", "seed": 7},
        policy={"mode": "ask"},
        limits={"host_calls": 20},
        created_at=1000.0,
        updated_at=1000.0,
    )
    values.update(overrides)
    return RunRecord(**values)


def make_call(run_id: str = "r1", seq: int = 1, state: str = "pending", **overrides: Any) -> CallRecord:
    values: dict[str, Any] = dict(
        run_id=run_id,
        seq=seq,
        op="tool",
        address="tracker.get_ticket",
        args={"id": seq},
        key=f"k{seq}",
        kind="read",
        state=state,
    )
    values.update(overrides)
    return CallRecord(**values)


def make_snapshot(run_id: str = "r1", seq: int = 1, data: bytes = b"dump", kind: str = "pause") -> SnapshotRecord:
    return SnapshotRecord(
        run_id=run_id,
        seq=seq,
        monty_version="1.4.0",
        data=data,
        mac="ab" * 32,
        pending=[{"seq": seq, "op": "tool", "address": "a.b", "args": {}}],
        created_at=2000.0 + seq,
        kind=kind,
    )


# Values JSON carries back unchanged (NaN is never equal to itself, so it is left out).
WEIRD = {
    "nested": {"list": [1, 2.5, None, True, {"deep": ["x", {"deeper": []}]}], "empty": {}},
    "unicode": "héllo ✓ 日本語 🦀",
    "nul": "a\u0000b",
    "lone_surrogate": "\ud800",
    "big": 2**70,
    "negative_zero": -0.0,
    "inf": float("inf"),
    "quote": "it's \"quoted\" \\ ?",
    "ключ": "значение",
}
