"""Long work: cell event latency, and parked runs holding no worker processes.

1. Cell event latency: a program emits N outputs (one every ~20 ms); an
   observer long-polls `wait_cell`. Latency = when the observer got the event −
   when the event was stored. Reported for an observer in the same process
   (woken directly) and in a second process (polling the store).
2. 1,000 parked runs (half `wait_for`, half long sleeps): store size, the
   number of Monty worker processes alive while they are parked (the pool's idle
   workers are not held by any run), and that the runs still continue after the
   pool is closed and a new runtime wakes them.

    python bench/long_bench.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from tether._engine.rules.policy import Policy  # noqa: E402
from tether._runtime import Runtime  # noqa: E402
from tether._store import open_store  # noqa: E402


def monty_workers() -> int:
    """Monty worker processes that are children of this process."""
    me, n = os.getpid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="ignore")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and "monty" in os.path.basename(cmd):
            n += 1
    return n


EMITTER = """
import asyncio
for i in range({n}):
    emit(i)
    await asyncio.sleep(0.02)
'done'
"""

OBSERVER = """
import asyncio, json, os, sys, time
sys.path.insert(0, {src!r})
from tether._runtime import Runtime
from tether._store import open_store
async def main():
    rt = Runtime(store=open_store(sys.argv[1]), type_check=False)
    cursor, lat = 0, []
    while True:
        o = await rt.wait_cell(sys.argv[2], after=cursor, timeout_ms=10000)
        now = time.time()
        for e in o["events"]:
            if e["type"] == "output":
                ev = rt.store.get_events(sys.argv[2], after=e["id"] - 1, limit=1)[0]
                lat.append(now - ev.created_at)
        cursor = o["cursor"]
        if o["status"] != "running":
            break
    print(json.dumps(lat))
asyncio.run(main())
sys.stdout.flush()
os._exit(0)
"""


async def cell_latency(store_url: str, n: int) -> dict:
    async with Runtime(store=open_store(store_url), type_check=False) as rt:
        # In-process observer.
        obs = await rt.start_cell(EMITTER.format(n=n), yield_after_ms=0)
        cursor, lat = obs["cursor"], []
        while True:
            o = await rt.wait_cell(obs["cell_id"], after=cursor, timeout_ms=10_000)
            now = time.time()
            for e in o["events"]:
                if e["type"] == "output":
                    ev = rt.store.get_events(obs["cell_id"], after=e["id"] - 1, limit=1)[0]
                    lat.append(now - ev.created_at)
            cursor = o["cursor"]
            if o["status"] != "running":
                break
        # Second-process observer.
        obs = await rt.start_cell(EMITTER.format(n=n), yield_after_ms=0)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", OBSERVER.format(src=str(_SRC)), store_url, obs["cell_id"],
            stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        remote = json.loads(out)
    return {
        "in_process_p50_ms": round(statistics.median(lat) * 1000, 3),
        "in_process_p99_ms": round(sorted(lat)[int(len(lat) * 0.99) - 1] * 1000, 3),
        "second_process_p50_ms": round(statistics.median(remote) * 1000, 3),
        "second_process_p99_ms": round(sorted(remote)[int(len(remote) * 0.99) - 1] * 1000, 3),
        "events": len(lat) + len(remote),
    }


async def parked_runs(store_url: str, path: Path, runs: int) -> dict:
    rt = Runtime(store=open_store(store_url), type_check=False, policy=Policy(writes="allow"))
    await rt.engine.pool.start()
    t0 = time.perf_counter()
    ids = []
    for i in range(runs):
        code = (f"v = await wait_for('go', timeout=3600)\nv + {i}" if i % 2 == 0
                else "import asyncio\nawait asyncio.sleep(600)\n'slept'")
        r = await rt.execute(code)
        assert r.status == "waiting", r.error
        ids.append(r.run_id)
    park_s = time.perf_counter() - t0
    workers_with_pool = monty_workers()
    await rt.engine.pool.close()
    workers_after_close = monty_workers()
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    # Still resumable with no worker alive beforehand: a new runtime continues one of each kind.
    async with Runtime(store=open_store(store_url), type_check=False) as rt2:
        key = rt2.list_waits(ids[0])[0]["key"]
        woke = await rt2.resolve_wait(key, 41)
        assert woke["run"]["result"] == 41, woke
    return {
        "runs": runs,
        "park_ms_per_run": round(park_s / runs * 1000, 3),
        "store_mb": round(size / 1e6, 2),
        "store_kb_per_run": round(size / runs / 1000, 2),
        "pool_idle_workers_while_parked": workers_with_pool,
        "workers_held_by_parked_runs": workers_after_close,
        "resumed_after_pool_closed": True,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n_events = 20 if args.quick else 100
    n_runs = 100 if args.quick else 1000
    with tempfile.TemporaryDirectory() as tmp:
        lat = await cell_latency(f"sqlite:///{tmp}/cells.db", n_events)
        db = Path(tmp) / "parked.db"
        parked = await parked_runs(f"sqlite:///{db}", db, n_runs)
    print("cell event latency (emit -> wait_cell returns)")
    for k, v in lat.items():
        print(f"  {k:<26} {v}")
    print(f"{n_runs} parked runs (waits and sleeps)")
    for k, v in parked.items():
        print(f"  {k:<32} {v}")
    print(json.dumps({"bench": "long", "cell_latency": lat, "parked": parked}))


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)
