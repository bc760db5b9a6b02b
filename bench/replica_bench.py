"""Events across replicas on Postgres: LISTEN/NOTIFY against polling, measured in the same run.

Two processes share a throwaway Postgres (tests/pg.py, or --pg-url). Process A
runs a cell; this process (replica B) follows it with ``wait_cell``.

- emit → cell_wait: A's program emits every 50 ms; latency is B receiving the
  event minus the event's ``created_at`` (A's commit, same host clock).
- signal → event: A signals the cell (which parks on ``wait_for_signal``), the
  run continues in A and emits; latency is B receiving the event minus the
  signal's ``resolved_at`` (when it was recorded).

Each is measured with B listening (NOTIFY) and with B's listener off (polling,
the fallback), interleaved. Targets (issue 13): emit ≤ 50 ms p50, signal ≤ 25 ms
p50 — printed as met or missed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from tether.runs.runtime import Runtime  # noqa: E402
from tether.store import open_store  # noqa: E402

EMITS = """
import asyncio
for i in range(N):
    await asyncio.sleep(0.05)
    emit(i)
"""

SIGNALS = """
for i in range(N):
    v = await wait_for_signal("s" + str(i))
    emit(v)
"""

CHILD = r"""
import asyncio, json, sys, time
from tether.runs.runtime import Runtime
from tether.store import open_store
url, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
async def main():
    async with Runtime(store=open_store(url), type_check=False) as rt:
        code = {"emit": EMITS, "signal": SIGNALS}[kind].replace("N", str(n))
        obs = await rt.start_cell(code, yield_after_ms=50)
        print(obs["cell_id"], flush=True)
        sys.stdin.readline()  # B is watching
        if kind == "emit":
            handle = rt.running(obs["cell_id"])
            if handle is not None:
                await handle.result()
        else:
            for i in range(n):
                while rt.store.get_run(obs["cell_id"]).status != "waiting":
                    await asyncio.sleep(0.005)
                await rt.signal(obs["cell_id"], "s" + str(i), i)
                await asyncio.sleep(0.05)
asyncio.run(main())
"""


async def follow(url: str, kind: str, n: int, listen: bool) -> list[float]:
    child = subprocess.Popen(
        [sys.executable, "-c", f"EMITS = {EMITS!r}\nSIGNALS = {SIGNALS!r}\n" + CHILD, url, kind, str(n)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    cell_id = child.stdout.readline().strip()
    received: dict[int, float] = {}
    async with Runtime(store=open_store(url), type_check=False) as rt:
        if not listen:
            rt.bus.listen = lambda: None  # polling only, the fallback
        else:
            rt.bus.listen()
            await asyncio.sleep(0.3)  # the listener's connection is up before A starts
        child.stdin.write("go\n")
        child.stdin.flush()
        cursor, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            obs = await rt.wait_cell(cell_id, after=cursor, timeout_ms=2000)
            now = time.time()
            for e in obs["events"]:
                if e["type"] == "output":
                    received[e["id"]] = now
            cursor = obs["cursor"]
            if obs["status"] in ("completed", "failed", "terminated"):
                break
        events = {e.event_id: e for e in rt.store.get_events(cell_id)}
        waits = {w.name: w for w in rt.store.list_waits(run_id=cell_id, status=None)} if kind == "signal" else {}
    child.wait(timeout=60)
    out = []
    for event_id, at in received.items():
        e = events[event_id]
        if kind == "emit":
            out.append(at - e.created_at)
        else:
            w = waits.get(f"signal:s{e.data['value']}")
            if w is not None and w.resolved_at:
                out.append(at - w.resolved_at)
    return out


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg-url")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cluster = None
    url = args.pg_url
    if url is None:
        import pg

        cluster = pg.start()
        url = cluster.url
    try:
        results: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for kind in ("emit", "signal"):
                order = [True, False] if r % 2 == 0 else [False, True]
                for listen in order:
                    key = f"{kind} {'notify' if listen else 'polling'}"
                    results.setdefault(key, []).extend(await follow(url, kind, args.n, listen))
    finally:
        if cluster is not None:
            cluster.stop()
    targets = {"emit": 50.0, "signal": 25.0}
    rows = {}
    print(f"{'path':<18} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}  target")
    for key, values in results.items():
        kind = key.split()[0]
        p50 = statistics.median(values) * 1000
        rows[key] = {"n": len(values), "p50_ms": round(p50, 1), "p90_ms": round(p(values, 0.9), 1),
                     "max_ms": round(max(values) * 1000, 1)}
        verdict = f"≤ {targets[kind]:g} ms p50: {'met' if p50 <= targets[kind] else 'missed'}"
        print(f"{key:<18} {len(values):>4} {p50:>8.1f} {p(values, 0.9):>8.1f} {max(values) * 1000:>8.1f}  {verdict}")
    if args.json:
        print(json.dumps({"bench": "replica", "results": rows}))


if __name__ == "__main__":
    asyncio.run(main())
