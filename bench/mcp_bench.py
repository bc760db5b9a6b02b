"""What MCP costs on top of the Python API, and how `tether serve --http` holds up under load.

    .venv/bin/python bench/mcp_bench.py                       # both parts, full size
    .venv/bin/python bench/mcp_bench.py --clients 10 --duration 3 --iterations 50   # a quick look

Part 1 runs the same 10-call program through ``Runtime.execute`` and through
the ``execute`` tool of an in-memory MCP client (both protocol eras) and
prints the p50 of each and their ratio.

Part 2 starts ``tether serve --http 127.0.0.1:<free port> --dev`` in a
subprocess and points ``--clients`` MCP clients at it, each calling
``execute`` in a loop until ``--duration`` seconds have passed (a client that
is told ``overloaded`` waits the ``retry_after_ms`` it was given). It prints
completed runs, errors by code and latency percentiles, then stops the
server. Only loopback is ever used.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = """\
import tools
titles = []
for i in range(10):
    t = await tools.helpdesk.get_ticket(ticket_id=f"T{1001 + i}")
    titles.append(t["title"])
len(titles)
"""
CALLS = 10


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


# -- part 1: MCP overhead ----------------------------------------------------------------


async def overhead(iterations: int) -> None:
    from mcp import Client

    from tether._runtime import Runtime
    from tether._server.mcp import TetherServer
    from tether.demo.helpdesk import make_helpdesk

    async with Runtime(tools=make_helpdesk()) as rt:
        server = TetherServer(rt)

        async def api() -> None:
            r = await rt.execute(PROGRAM)
            assert r.status == "completed" and r.calls == CALLS, r.error

        timings: dict[str, list[float]] = {}
        timings["python api"] = await _time(api, iterations)
        for label, mode in (("mcp legacy (2025-11-25)", "legacy"), ("mcp modern (2026-07-28)", "auto")):
            async with Client(server.mcp, mode=mode) as client:
                async def call(client: Client = client) -> None:
                    r = await client.call_tool("execute", {"code": PROGRAM})
                    assert not r.is_error and r.structured_content["result"] == CALLS, r.content[0].text
                timings[label] = await _time(call, iterations)

    base = statistics.median(timings["python api"])
    print(f"\n== execute, {CALLS}-call program, in-process, {iterations} runs each ==")
    for label, values in timings.items():
        p50 = statistics.median(values)
        print(f"  {label:<26} p50 {p50 * 1000:7.2f} ms   p99 {pct(values, 0.99) * 1000:7.2f} ms   "
              f"x{p50 / base:.2f} of the API")
        RESULT.setdefault("overhead", []).append(
            {"variant": label, "p50_ms": round(p50 * 1000, 3), "ratio_to_api": round(p50 / base, 3)})


async def _time(fn, iterations: int) -> list[float]:
    for _ in range(max(3, iterations // 10)):  # warm the pool, the type checker, the caches
        await fn()
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


# -- part 2: load over HTTP ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(workers: int, queue_depth: int, queue_timeout: float):
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        root = Path(tmp)
        (root / "tether.toml").write_text(
            f"[sandbox]\nmin_workers = {workers}\nmax_workers = {workers}\n\n"
            f"[server]\nmax_concurrent_runs = {workers}\nqueue_depth = {queue_depth}\n"
            f"queue_timeout_seconds = {queue_timeout}\n")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
        env["TETHER_HOME"] = str(root / "home")
        log = open(root / "server.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "--config", str(root / "tether.toml"), "serve",
             "--http", f"127.0.0.1:{port}", "--dev", "--tools", "tether.demo.helpdesk"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"server exited: {(root / 'server.log').read_text()}")
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("server did not start listening within 30 s")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()


async def load(clients: int, duration: float, mode: str, workers: int, queue_depth: int,
               queue_timeout: float) -> None:
    from mcp import Client

    with served(workers, queue_depth, queue_timeout) as url:
        latencies: list[float] = []
        ok_latencies: list[float] = []
        outcomes: collections.Counter[str] = collections.Counter()
        start = time.monotonic()
        stop_at = start + duration

        async def client(i: int) -> None:
            try:
                async with Client(url, mode=mode) as c:
                    while time.monotonic() < stop_at:
                        t0 = time.perf_counter()
                        try:
                            r = await c.call_tool("execute", {"code": PROGRAM})
                        except Exception as exc:  # a transport failure is a result too
                            outcomes[f"transport:{type(exc).__name__}"] += 1
                            latencies.append(time.perf_counter() - t0)
                            await asyncio.sleep(0.1)
                            continue
                        elapsed = time.perf_counter() - t0
                        latencies.append(elapsed)
                        data = r.structured_content or {}
                        if not r.is_error and data.get("status") == "completed":
                            outcomes["completed"] += 1
                            ok_latencies.append(elapsed)
                            continue
                        error = data.get("error") or {}
                        outcomes[error.get("code", "unknown")] += 1
                        if error.get("code") == "overloaded":
                            wait = error["details"]["retry_after_ms"] / 1000
                            await asyncio.sleep(min(wait, max(0.0, stop_at - time.monotonic())))
            except Exception as exc:
                outcomes[f"connect:{type(exc).__name__}"] += 1

        await asyncio.gather(*[client(i) for i in range(clients)])
        wall = time.monotonic() - start

    done = outcomes["completed"]
    print(f"\n== load: {clients} MCP clients ({'modern' if mode == 'auto' else mode}) x {duration:g} s against "
          f"tether serve --http on loopback; {workers} run slots, queue {queue_depth} ==")
    print(f"  completed runs   {done} ({done / wall:.1f}/s, {done * CALLS / wall:.0f} tool calls/s) in {wall:.1f} s")
    print(f"  responses        {sum(outcomes.values())}")
    errors = {k: v for k, v in outcomes.items() if k != "completed"}
    print("  errors by code   " + (", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "none"))
    print(f"  latency, completed runs: p50 {pct(ok_latencies, 0.5) * 1000:.1f} ms, "
          f"p99 {pct(ok_latencies, 0.99) * 1000:.1f} ms")
    print(f"  latency, all responses:  p50 {pct(latencies, 0.5) * 1000:.1f} ms, "
          f"p99 {pct(latencies, 0.99) * 1000:.1f} ms")
    RESULT["load"] = {"clients": clients, "seconds": round(wall, 1), "completed": done, "errors": errors,
                      "p50_ms_completed": round(pct(ok_latencies, 0.5) * 1000, 1),
                      "p99_ms_completed": round(pct(ok_latencies, 0.99) * 1000, 1)}


RESULT: dict = {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=200, help="runs per variant in part 1")
    p.add_argument("--clients", type=int, default=100, help="concurrent MCP clients in part 2")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load in part 2")
    p.add_argument("--mode", choices=("auto", "legacy"), default="auto",
                   help="protocol era of the load clients: auto (2026-07-28) or legacy (2025-11-25)")
    p.add_argument("--workers", type=int, default=2, help="sandbox workers = run slots of the server")
    p.add_argument("--queue-depth", type=int, default=16)
    p.add_argument("--queue-timeout", type=float, default=10.0)
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-load", action="store_true")
    p.add_argument("--quick", action="store_true", help="30 runs per variant; 10 clients for 5 s")
    args = p.parse_args()
    if args.quick:
        args.iterations, args.clients, args.duration = 30, 10, 5.0
    # The HTTP client logs every request at INFO; thousands of lines say nothing here.
    for name in ("httpx", "httpx2", "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)

    async def run() -> None:
        if not args.skip_overhead:
            await overhead(args.iterations)
        if not args.skip_load:
            await load(args.clients, args.duration, args.mode, args.workers, args.queue_depth, args.queue_timeout)

    asyncio.run(run())
    print(json.dumps({"bench": "mcp", **RESULT}))
    sys.stdout.flush()
    # pydantic-monty can abort at interpreter shutdown after async host calls;
    # everything is closed and printed by now.
    os._exit(0)


if __name__ == "__main__":
    main()
