"""Events across replicas on Postgres: LISTEN/NOTIFY against polling, measured in the same run.

Two processes share a throwaway Postgres (tests/pg.py, or --pg-url). Process A
runs a cell; this process (replica B) follows it with ``wait_cell``.

- emit → cell_wait: A's program emits every 50 ms; latency is B receiving the
  event minus the event's ``created_at`` (A's commit, same host clock).
- signal → event: A signals the cell (which parks on ``wait_for_signal``), the
  run continues in A and emits; latency is B receiving the event minus the
  signal's ``resolved_at`` (when it was recorded).

Each is measured with B listening (NOTIFY) and with B's listener off (polling,
the fallback), interleaved. Targets: emit ≤ 50 ms p50, signal ≤ 25 ms p50 with
NOTIFY — printed as met or missed, never asserted.

- cancel → cancelled: A executes a run blocked in a call; B cancels it. Latency
  is B's ``cancel()`` to its return with the run cancelled: A heard the request
  (NOTIFY; by polling, at its next lease renewal, a third of the 30 s lease),
  stopped the run, and B heard it ended.
- settle → continued: A is a runner; B settles a parked run's wait without
  continuing it (``continue_run=False``, as a resolver without the run's sources
  does). Latency is the wait's ``resolved_at`` to B receiving the event the run
  emits once A continued it (by polling, A's scan every 2 s finds it).

    python bench/replica_bench.py [--quick] [--rounds 3] [--n 40] [--only emit|signal|cancel|settle] [--pg-url URL]

``--quick`` (CI's pass) measures emit and signal only, 8 of each a round, one round: the polling
cancel waits a third of the lease for each sample. Without PostgreSQL's binaries it prints a skip.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import common  # noqa: E402
from tether._runtime import Runtime  # noqa: E402
from tether._store import open_store  # noqa: E402

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
from tether._runtime import Runtime
from tether._store import open_store
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
            rt.engine.events.notices.start = lambda: None  # polling only, the fallback
        else:
            rt.engine.events.listen()
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


CANCELLER = r"""
import asyncio, sys
from tether._runtime import Runtime
from tether._store import open_store
from tether._tools.model import Annotations, Tool
url, n, listen = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
started = asyncio.Event()
async def block(args):
    started.set()
    await asyncio.sleep(600)
tool = Tool("slow", "block", "Blocks.", {"type": "object", "properties": {}}, block,
            annotations=Annotations(read_only=True), timeout_seconds=900)
async def main():
    async with Runtime(store=open_store(url), tools=[tool], type_check=False) as rt:  # the default lease, 30 s
        if listen:
            rt.engine.events.listen()
            await asyncio.sleep(0.5)
        else:
            rt.engine.events.notices.start = lambda: None
        for i in range(n):
            handle = await rt.begin("import tools\nawait tools.slow.block()")
            await started.wait()
            started.clear()
            print(handle.run_id, flush=True)
            await handle.result()
asyncio.run(main())
"""


async def local_cancels(url: str, n: int) -> list[float]:
    """The baseline for ``cancels``: the same blocked run cancelled in the process executing it.

    Most of either figure is the sandbox's stop grace (a program blocked in a host call is cut off
    after STOP_GRACE_SECONDS); what crossing replicas adds is the difference."""
    from tether._tools.model import Annotations, Tool

    started = asyncio.Event()

    async def block(args: dict) -> None:
        started.set()
        await asyncio.sleep(600)

    tool = Tool("slow", "block", "Blocks.", {"type": "object", "properties": {}}, block,
                annotations=Annotations(read_only=True), timeout_seconds=900)
    out = []
    async with Runtime(store=open_store(url), tools=[tool], type_check=False) as rt:
        for _ in range(n):
            handle = await rt.begin("import tools\nawait tools.slow.block()")
            await started.wait()
            started.clear()
            t0 = time.time()
            result = await rt.cancel(handle.run_id, "bench")
            if result.status == "cancelled":
                out.append(time.time() - t0)
    return out


async def cancels(url: str, n: int, listen: bool) -> list[float]:
    """A executes runs blocked in a call; B cancels each: latency is B's cancel() call to its return
    with the run cancelled (A stopped it and B heard so)."""
    child = subprocess.Popen([sys.executable, "-c", CANCELLER, url, str(n), "1" if listen else "0"],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    out = []
    async with Runtime(store=open_store(url), type_check=False) as rt:
        if not listen:
            rt.engine.events.notices.start = lambda: None
        for _ in range(n):
            run_id = child.stdout.readline().strip()
            t0 = time.time()
            result = await rt.cancel(run_id, "bench")
            if result.status == "cancelled":
                out.append(time.time() - t0)
    child.wait(timeout=120)
    return out


RESOLVED = """
for i in range(N):
    v = await wait_for("w" + str(i))
    emit(v)
"""

RUNNER = r"""
import asyncio, sys
from tether._runtime import Runtime
from tether._engine.worker import Worker
from tether._store import open_store
url, listen = sys.argv[1], sys.argv[2] == "1"
async def main():
    async with Runtime(store=open_store(url), type_check=False) as rt:
        if not listen:
            rt.engine.events.notices.start = lambda: None
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(sys.stdin, stop.set)  # B closes our stdin when done
        print("ready", flush=True)
        await Worker(rt.engine).work(stop=stop)
asyncio.run(main())
"""


async def settles(url: str, n: int, listen: bool) -> list[float]:
    """A is a runner; B starts a run that waits n times and settles each wait without continuing the run
    (continue_run=False, as a resolver lacking the run's sources does): latency is the wait's
    ``resolved_at`` to B receiving the event the run emits once A continued it."""
    child = subprocess.Popen([sys.executable, "-c", RUNNER, url, "1" if listen else "0"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    child.stdout.readline()
    await asyncio.sleep(0.5)  # its listener is up
    received: dict[int, float] = {}
    async with Runtime(store=open_store(url), type_check=False) as rt:
        if not listen:
            rt.engine.events.notices.start = lambda: None
        run_id = rt.start(RESOLVED.replace("N", str(n)))
        cursor, deadline = 0, time.monotonic() + 300
        while time.monotonic() < deadline:
            run = rt.store.get_run(run_id)
            if run.status in ("completed", "failed", "cancelled"):
                break
            if run.status == "waiting":
                # The run's record keeps the key's digest (D-33): the key is recomputed from the secret.
                key = rt.engine.waits.key(run_id, run.pending["name"])
                await rt.resolve_wait(key, run.pending["name"], continue_run=False)
                while time.monotonic() < deadline:
                    obs = await rt.wait_cell(run_id, after=cursor, timeout_ms=5000)
                    cursor = obs["cursor"]
                    outputs = [e for e in obs["events"] if e["type"] == "output"]
                    for e in outputs:
                        received[e["id"]] = time.time()
                    if outputs:
                        break
            else:
                await asyncio.sleep(0.005)
        events = {e.event_id: e for e in rt.store.get_events(run_id)}
        waits = {w.name: w for w in rt.store.list_waits(run_id=run_id, status=None)}
    child.stdin.close()
    child.wait(timeout=60)
    return [at - waits[events[i].data["value"]].resolved_at for i, at in received.items()
            if events[i].data.get("value") in waits]


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def measure(url: str, kind: str, n: int, listen: bool) -> list[float]:
    if kind == "cancel":
        # Polling waits for the owner's lease renewal (a third of 30 s): fewer samples.
        return await cancels(url, n if listen else max(3, n // 8), listen)
    if kind == "settle":
        return await settles(url, n if listen else max(5, n // 4), listen)
    return await follow(url, kind, n, listen)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="emit and signal only, 8 samples, one round")
    ap.add_argument("--pg-url")
    ap.add_argument("--n", type=int, default=None, help="samples a path a round (default 40, 8 with --quick)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3, 1 with --quick)")
    ap.add_argument("--only", choices=KINDS, action="append", help="measure only these paths")
    args = ap.parse_args()
    n = args.n or (8 if args.quick else 40)
    rounds = args.rounds or (1 if args.quick else 3)
    kinds = args.only or (("emit", "signal") if args.quick else KINDS)
    results: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        url = args.pg_url
        if url is None:
            cluster = stack.enter_context(common.postgres_cluster())
            if cluster is None:
                common.emit("replica", args.quick, {"skipped": "PostgreSQL's binaries are missing", "targets": []})
                return
            url = cluster.url
        for r in range(rounds):
            if "cancel" in kinds:
                results.setdefault("cancel same process", []).extend(await local_cancels(url, n))
            for kind in kinds:
                order = [True, False] if r % 2 == 0 else [False, True]
                for listen in order:
                    key = f"{kind} {'notify' if listen else 'polling'}"
                    results.setdefault(key, []).extend(await measure(url, kind, n, listen))
    rows = {}
    print(f"{'path':<20} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for key, values in results.items():
        rows[key] = {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 1),
                     "p90_ms": round(p(values, 0.9), 1), "p99_ms": round(p(values, 0.99), 1),
                     "max_ms": round(max(values) * 1000, 1)}
        print(f"{key:<20} {len(values):>4} {rows[key]['p50_ms']:>8.1f} {rows[key]['p90_ms']:>8.1f} "
              f"{rows[key]['p99_ms']:>8.1f} {rows[key]['max_ms']:>8.1f}")
    targets = [common.target(f"{kind} -> event with NOTIFY, p50", rows[f"{kind} notify"]["p50_ms"], limit, "ms")
               for kind, limit in TARGETS.items() if f"{kind} notify" in rows]
    print()
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("replica", args.quick, {"rounds": rounds, "n": n, "rows": rows, "targets": targets})


KINDS = ("emit", "signal", "cancel", "settle")
# Cancellations and settled waits have no target (reported, compared with polling).
TARGETS = {"emit": 50.0, "signal": 25.0}


if __name__ == "__main__":
    asyncio.run(main())
