"""Serving: N concurrent MCP clients over streamable HTTP against tether, its floor and FastMCP Code Mode.

Four servers, each a process of its own on loopback, all started before the
first measurement and kept up to the end:

- **floor** — the MCP SDK's own server (``MCPServer``) whose ``execute`` runs the
  program by ``feed_run`` in one warm bare-Monty pool (1–2 workers, as tether's
  default), no journal, no policy, no signing (bench/serve_peers.py);
- **tether (file store)** — ``tether serve --http --dev`` with its defaults: the
  SQLite file store, 2 run slots, a queue of 16;
- **tether (Postgres)** — the same on a throwaway cluster (tests/pg.py; skipped
  when PostgreSQL's binaries are missing): ``TETHER_STORE_URL`` is all that differs;
- **FastMCP Code Mode** — FastMCP with its ``CodeMode()`` transform, its defaults
  (a new Monty pool per execute).

Two more on request, to take tether's gap to the floor apart: ``--only ...,engine``
adds the floor's server running tether's ``Runtime.execute`` (the engine without
tether's serving layer); ``--base COMMIT|DIR`` adds ``tether serve`` from another
build (a commit's ``src`` by ``git archive``, or a folder holding ``src/tether``,
``common.tree_of``), for before/after ratios taken in the same windows.

Every client calls ``execute`` with the core program (10 sequential reads of
the same ``get`` function, in each server's dialect) in a loop. Windows
alternate: in each round every server gets one window of ``--seconds`` with
all ``--clients`` connected before the clock starts, the order rotated every
round; a warm-up window each first. Reported per server: programs/s, client
latency p50/p99, server CPU seconds per program (the server process and its
children, i.e. its Monty workers; for Postgres plus the cluster's processes),
and ratios against the floor, FastMCP and the file store — from the totals and
paired by round (median over rounds of the ratio within the round).

One Python process runs all the clients, on the same 2 shared cores as the
servers: it is part of what is measured, and its own CPU is printed.

    python bench/serve_bench.py [--quick] [--clients 16] [--seconds 5] [--rounds 3] [--mode legacy|auto] [--no-pg]
                                [--base COMMIT|DIR] [--only floor,engine,tether_file,...]
"""

from __future__ import annotations

import argparse
import asyncio
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
from typing import Any, Callable, Iterator

import common
from common import EXPECTED, FASTMCP_PROGRAM, PROGRAM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

TARGETS = {"floor": 0.7, "fastmcp": 3.0, "postgres": 0.7}
LABELS = {"floor": "floor: MCP SDK server + warm bare Monty", "tether_file": "tether serve, defaults (file store)",
          "tether_pg": "tether serve, Postgres store", "fastmcp": "FastMCP Code Mode (defaults)",
          "tether_base": "tether serve, defaults, the --base build",
          "tether_pg_base": "tether serve, Postgres store, the --base build",
          "engine": "floor's server + tether's Runtime.execute"}
_TICK = os.sysconf("SC_CLK_TCK")
WINDOW_GRACE_S = 120.0


# --- processes ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(root: int) -> float:
    """utime + stime of ``root`` and its living descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    spent: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        spent[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += spent.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


class Served:
    """One server process on a free loopback port, its log in ``log``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, db_pid: int | None = None) -> None:
        self.name, self.log, self.db_pid = name, log, db_pid
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in argv]
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     cwd=str(HERE))
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def wait_listening(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.name} did not listen within {timeout:g} s: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid) + (cpu_seconds(self.db_pid) if self.db_pid else 0.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def servers(tmp: Path, with_pg: bool, only: set[str], base: str | None = None) -> Iterator[tuple[dict[str, Served], str]]:
    """Every server started; yields them and a note on what was skipped."""
    base_env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
    src = str(HERE.parent / "src")
    base_env["PYTHONPATH"] = os.pathsep.join([str(HERE), src, base_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    config = tmp / "tether.toml"
    config.write_text("# tether's defaults: nothing set\n")
    tether = [sys.executable, "-m", "tether.cli", "--config", str(config), "serve", "--http", "127.0.0.1:{port}",
              "--dev", "--tools", str(HERE / "common.py")]
    clusters: list[Any] = []
    note = ""
    started: dict[str, Served] = {}
    try:
        if "floor" in only:
            started["floor"] = Served("floor", [sys.executable, str(HERE / "serve_peers.py"), "floor", "{port}"],
                                      base_env, tmp / "floor.log")
        if "tether_file" in only:
            started["tether_file"] = Served("tether_file", tether,
                                            {**base_env, "TETHER_HOME": str(tmp / "home_file")},
                                            tmp / "tether_file.log")
        base_path = ""
        if base is not None:
            # Another build's src, served the same way: a before/after pair measured in the same windows, on
            # the same machine at the same moment.
            base_path = os.pathsep.join([str(HERE), base, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            started["tether_base"] = Served("tether_base", tether,
                                            {**base_env, "PYTHONPATH": base_path,
                                             "TETHER_HOME": str(tmp / "home_base")}, tmp / "tether_base.log")
        if with_pg:
            import pg

            reason = pg.missing_reason()
            if reason is None:
                # A server of the caller's (TETHER_TEST_PG_URL) is used as it is; its CPU is not counted.
                given = os.environ.get("TETHER_TEST_PG_URL")
                pg_servers = [("tether_pg", base_env)]
                if base is not None and given is None:
                    # The --base build on Postgres too, on a cluster of its own so each server's cluster CPU is
                    # its own: the Postgres before/after from the same windows.
                    pg_servers.append(("tether_pg_base", {**base_env, "PYTHONPATH": base_path}))
                for name, env in pg_servers:
                    url, db_pid = given, None
                    if url is None:
                        clusters.append(pg.start())
                        url = clusters[-1].url
                        db_pid = int((clusters[-1].directory / "data" / "postmaster.pid").read_text().split()[0])
                    started[name] = Served(
                        name, tether, {**env, "TETHER_HOME": str(tmp / f"home_{name}"), "TETHER_STORE_URL": url},
                        tmp / f"{name}.log", db_pid=db_pid)
            else:
                note = f"tether on Postgres skipped: {reason}"
        elif "tether_pg" in only:
            note = "tether on Postgres skipped (--no-pg)"
        if "engine" in only:
            started["engine"] = Served("engine", [sys.executable, str(HERE / "serve_peers.py"), "engine", "{port}"],
                                       {**base_env, "TETHER_HOME": str(tmp / "home_engine")}, tmp / "engine.log")
        if "fastmcp" in only:
            peer = [sys.executable, str(HERE / "serve_peers.py"), "fastmcp", "{port}"]
            started["fastmcp"] = Served("fastmcp", peer, base_env, tmp / "fastmcp.log")
        for s in started.values():
            s.wait_listening()
        yield started, note
    finally:
        for s in started.values():
            s.stop()
        for cluster in clusters:
            cluster.stop()


# --- load ---------------------------------------------------------------------------


def checker(name: str) -> Callable[[Any], bool]:
    """Whether a call's answer is the program's result, in each server's shape."""
    def tether(r: Any) -> bool:
        data = r.structured_content or {}
        return not r.is_error and data.get("status") == "completed" and data.get("result") == EXPECTED

    def text(r: Any) -> bool:
        try:
            return not r.is_error and int(r.content[0].text) == EXPECTED
        except (ValueError, IndexError, AttributeError):
            return False

    return tether if name.startswith("tether") else text


async def window(s: Served, clients: int, seconds: float, mode: str) -> dict[str, Any]:
    """``clients`` MCP clients call ``execute`` in a loop for ``seconds``, timed from when all are connected."""
    from mcp import Client

    program = FASTMCP_PROGRAM if s.name == "fastmcp" else PROGRAM
    ok = checker(s.name)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    connected = 0
    go = asyncio.Event()
    clock: dict[str, float] = {}

    async def client() -> None:
        nonlocal connected
        async with Client(s.url, mode=mode) as c:
            connected += 1
            if connected == clients:
                clock["cpu"], clock["self"] = s.cpu(), time.process_time()
                clock["start"] = time.perf_counter()
                clock["stop"] = clock["start"] + seconds
                go.set()
            await go.wait()
            while time.perf_counter() < clock["stop"]:
                t0 = time.perf_counter()
                try:
                    r = await c.call_tool("execute", {"code": program})
                except Exception as exc:  # noqa: BLE001 - a transport failure is a result too
                    key = f"transport:{type(exc).__name__}"
                    errors[key] = errors.get(key, 0) + 1
                    await asyncio.sleep(0.05)
                    continue
                if ok(r):
                    # A program that finished after the window closed is not counted in it.
                    if time.perf_counter() <= clock["stop"]:
                        latencies.append(time.perf_counter() - t0)
                    continue
                data = r.structured_content or {}
                code = (data.get("error") or {}).get("code") or "wrong_result"
                errors[code] = errors.get(code, 0) + 1
                if code == "overloaded":
                    await asyncio.sleep(data["error"]["details"]["retry_after_ms"] / 1000)

    # Bounded: a server that stops answering ends the benchmark (a crash, seen in CI), never hangs it.
    try:
        await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), seconds + WINDOW_GRACE_S)
    except TimeoutError:
        raise SystemExit(f"{s.name}: the window of {seconds:g} s had not ended {WINDOW_GRACE_S:g} s later "
                         f"(connected {connected}/{clients}); its log: {s.log}") from None
    wall = time.perf_counter() - clock["start"]
    return {"completed": len(latencies), "wall": wall, "latencies": latencies, "errors": errors,
            "cpu": s.cpu() - clock["cpu"], "client_cpu": time.process_time() - clock["self"]}


async def measure(started: dict[str, Served], clients: int, seconds: float, rounds: int, warmup_seconds: float,
                  mode: str) -> dict[str, list[dict[str, Any]]]:
    names = list(started)
    for name in names:
        await window(started[name], clients, warmup_seconds, mode)
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(await window(started[name], clients, seconds, mode))
            w = out[name][-1]
            print(f"  round {r + 1} {name:<12} {w['completed'] / w['wall']:7.1f} programs/s"
                  + (f"  errors {w['errors']}" if w["errors"] else ""), flush=True)
    return out


def summarize(windows: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    rate = {n: [w["completed"] / w["wall"] for w in ws] for n, ws in windows.items()}
    for name, ws in windows.items():
        done = sum(w["completed"] for w in ws)
        lat = sorted(x for w in ws for x in w["latencies"])
        errors: dict[str, int] = {}
        for w in ws:
            for k, v in w["errors"].items():
                errors[k] = errors.get(k, 0) + v
        row: dict[str, Any] = {
            "server": name, "label": LABELS[name], "programs": done,
            "programs_per_s": round(done / sum(w["wall"] for w in ws), 1),
            "p50_ms": round(common.quantile(lat, 0.5) * 1e3, 1) if lat else float("nan"),
            "p99_ms": round(common.quantile(lat, 0.99) * 1e3, 1) if lat else float("nan"),
            "cpu_ms_per_program": round(sum(w["cpu"] for w in ws) / done * 1e3, 2) if done else float("nan"),
            "client_cpu_ms_per_program": round(sum(w["client_cpu"] for w in ws) / done * 1e3, 2) if done else float("nan"),
            "errors": errors,
        }
        for base in ("floor", "fastmcp", "tether_file", "tether_base", "tether_pg_base", "engine"):
            if base in rate and base != name:
                row[f"x_{base}"] = round(row["programs_per_s"] / (sum(rate[base]) / len(rate[base])), 3)
                row[f"x_{base}_paired"] = round(statistics.median(a / b for a, b in zip(rate[name], rate[base]) if b),
                                                3)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 clients, 2 rounds of 2 s windows")
    p.add_argument("--clients", type=int, default=None, help="concurrent MCP clients (default 16; 8 with --quick)")
    p.add_argument("--seconds", type=float, default=None, help="seconds per window (default 5; 2 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="windows per server (default 3; 2 with --quick)")
    p.add_argument("--mode", choices=("legacy", "auto"), default="legacy",
                   help="protocol era of the clients: legacy (2025-11-25, every server speaks it) or auto")
    p.add_argument("--no-pg", action="store_true", help="leave out tether on Postgres")
    p.add_argument("--base", default=None, metavar="COMMIT|DIR",
                   help="also serve tether from this commit (its src by git archive) or folder (holding src/tether) "
                        "as tether_base: before/after in one run")
    p.add_argument("--only", default=None, help="comma-separated subset of " + ", ".join(LABELS)
                   + " (targets need their servers)")
    args = p.parse_args()
    clients = args.clients or (8 if args.quick else 16)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    rounds = args.rounds or (2 if args.quick else 3)
    for name in ("httpx", "httpx2", "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)

    only = set(args.only.split(",")) if args.only else set(LABELS) - {"tether_base", "engine"}
    if args.base:
        only.add("tether_base")
        if "tether_pg" in only and not args.no_pg:
            only.add("tether_pg_base")
    unknown = only - set(LABELS)
    if unknown:
        p.error(f"unknown server(s) {', '.join(sorted(unknown))}; choose from {', '.join(LABELS)}")
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tether-serve-bench-"))
        base = None
        if args.base:
            base = str(common.tree_of(args.base, Path(tmp)) / "src")
        started, note = stack.enter_context(servers(Path(tmp), not args.no_pg and "tether_pg" in only, only, base))
        print(f"serve: {clients} MCP clients ({args.mode}) over streamable HTTP, {rounds} rounds of {seconds:g} s "
              f"windows per server, rotated; the core program ({common.CALLS} reads)", flush=True)
        if note:
            print(note)
        windows = asyncio.run(measure(started, clients, seconds, rounds, min(seconds, 2.0), args.mode))
    rows = summarize(windows)
    print()
    print(common.table(rows, [("label", "server"), ("programs_per_s", "programs/s"), ("p50_ms", "p50 ms"),
                              ("p99_ms", "p99 ms"), ("cpu_ms_per_program", "server CPU ms/program"),
                              ("client_cpu_ms_per_program", "client CPU ms/program"),
                              ("x_floor_paired", "x floor"), ("x_fastmcp_paired", "x FastMCP"),
                              ("x_tether_file_paired", "x file store")]
                             + ([("x_tether_base_paired", "x base build")] if args.base else [])
                             + ([("x_tether_pg_base_paired", "x base build on Postgres")]
                                if any(r["server"] == "tether_pg_base" for r in rows) else [])
                             + ([("x_engine_paired", "x engine peer")] if "engine" in only else [])))
    by = {r["server"]: r for r in rows}
    targets = []

    def at_least(name: str, value: float, limit: float) -> None:
        targets.append({"target": name, "value": value, "limit": f">= {limit}", "unit": "x",
                        "met": bool(value >= limit)})

    if "tether_file" in by and "floor" in by:
        at_least("serving, tether defaults / floor (programs/s, paired)", by["tether_file"]["x_floor_paired"],
                 TARGETS["floor"])
    if "tether_file" in by and "fastmcp" in by:
        at_least("serving, tether defaults / FastMCP Code Mode (programs/s, paired)",
                 by["tether_file"]["x_fastmcp_paired"], TARGETS["fastmcp"])
    if "tether_pg" in by and "tether_file" in by:
        at_least("serving, Postgres / file store (programs/s, paired)", by["tether_pg"]["x_tether_file_paired"],
                 TARGETS["postgres"])
    print()
    print(common.table(targets, common.TARGET_COLUMNS))
    errors = {r["server"]: r["errors"] for r in rows if r["errors"]}
    if errors:
        print("errors: " + json.dumps(errors))
    common.emit("serve", args.quick, {"clients": clients, "seconds": seconds, "rounds": rounds, "mode": args.mode,
                                      "note": note, "rows": rows, "targets": targets})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
