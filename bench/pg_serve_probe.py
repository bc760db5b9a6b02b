"""Where a served program's CPU goes on Postgres: the server's threads, its Monty workers, the cluster's processes.

Starts ``tether serve --http --dev`` on a throwaway cluster (tests/pg.py) and, with
``--file``, the same on the SQLite file store, each with its Python threads named
for the OS (bench/named_threads.py), then drives serve_bench.py's clients in
alternating windows and reports CPU milliseconds a program split by:

- the server's threads: ``loop`` (the main thread: the event loop), ``store``
  (``tether-store_*``, the Postgres calls offloaded there, D-27), ``listen``
  (LISTEN/NOTIFY), ``asyncio`` (the loop's default executor), and the rest by
  name (Monty's Rust threads);
- ``workers``: the server's child processes (its Monty workers);
- the cluster: ``backend`` (the pool's connections), ``backend-listen`` (the
  listener's), ``cluster-other`` (walwriter, checkpointer, autovacuum...).

``--durable`` restarts the cluster with ``fsync``, ``synchronous_commit`` and
``full_page_writes`` on, as docs/deploy.md asks of a real one (tests/pg.py
starts clusters with them off). ``--statements`` preloads pg_stat_statements and prints what the cluster ran a
program, by statement: calls, plans, execution and planning time. It costs the
cluster CPU of its own, so the CPU split is best read from a run without it.

    python bench/pg_serve_probe.py [--file] [--clients 16] [--seconds 4] [--rounds 3] [--statements] [--durable]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import common
import serve_bench
from serve_bench import Served, window

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
_TICK = os.sysconf("SC_CLK_TCK")
# A thread kind's kernel time, shown beside it (and not added to the total twice).
_SYS = " (of it sys)"


def _cpu(stat_path: str, sys_only: bool = False) -> float:
    with open(stat_path) as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[12]) if sys_only else int(fields[11]) + int(fields[12])) / _TICK


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each kind of thread of ``pid`` (names without their trailing counters)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            spent = _cpu(f"/proc/{pid}/task/{tid}/stat")
            kernel = _cpu(f"/proc/{pid}/task/{tid}/stat", sys_only=True)
        except OSError:
            continue
        kind = "loop" if int(tid) == pid else re.sub(r"[-_]?\d+$", "", name) or name
        kind = {"tether-store": "store", "tether-listen": "listen"}.get(kind, kind)
        out[kind] = out.get(kind, 0.0) + spent
        out[f"{kind}{_SYS}"] = out.get(f"{kind}{_SYS}", 0.0) + kernel
    return out


def children_cpu(pid: int) -> float:
    return serve_bench.cpu_seconds(pid) - sum(v for k, v in thread_cpu(pid).items() if not k.endswith(_SYS))


def cluster_cpu(postmaster: int, apps: dict[int, str]) -> dict[str, float]:
    """CPU seconds of the cluster's processes: its backends by application name, the rest together."""
    out: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            if int(stat[stat.rindex(")") + 2:].split()[1]) != postmaster and int(entry) != postmaster:
                continue
            spent = _cpu(f"/proc/{entry}/stat")
        except (OSError, ValueError):
            continue
        app = apps.get(int(entry))
        kind = "cluster-other" if app is None else "backend-listen" if app == "tether-listen" else "backend"
        out[kind] = out.get(kind, 0.0) + spent
    return out


class Probe:
    def __init__(self, served: Served, url: str | None, postmaster: int | None) -> None:
        self.served, self.url, self.postmaster = served, url, postmaster

    def apps(self) -> dict[int, str]:
        import psycopg

        if self.url is None:
            return {}
        with psycopg.connect(self.url, autocommit=True, application_name="probe") as conn:
            return {pid: app for pid, app in conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity WHERE application_name LIKE 'tether%'")}

    def sample(self) -> dict[str, float]:
        pid = self.served.proc.pid
        out = thread_cpu(pid)
        out["workers"] = children_cpu(pid)
        if self.postmaster is not None:
            out.update(cluster_cpu(self.postmaster, self.apps()))
        return out


def statements(url: str) -> list[tuple[str, int, int, float, float]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(
            "SELECT query, calls, plans, total_exec_time, total_plan_time FROM pg_stat_statements"
            " WHERE query NOT LIKE '%pg_stat%' ORDER BY total_exec_time + total_plan_time DESC"))


def _restart(cluster: Any, options: str | None = None) -> None:
    """pg_ctl restart: with ``options`` (all of them) or, without, the options the cluster started with."""
    # With its log named: a restarted server would otherwise hold pg_ctl's output open, and this wait with it.
    subprocess.run([*cluster._as_user, cluster._pg_ctl, "-D", str(cluster.directory / "data"), "-l",
                    str(cluster.directory / "log"), *(["-o", options] if options else []), "-w", "restart"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def durable(cluster: Any) -> None:
    """Restart ``cluster`` as docs/deploy.md asks (fsync and synchronous_commit on), not as tests/pg.py starts it."""
    import pg

    _restart(cluster, f"-c listen_addresses='' -k {cluster.directory} -p {pg._PORT} -c max_connections=100"
                      " -c fsync=on -c synchronous_commit=on -c full_page_writes=on")


def with_statements(cluster: Any) -> None:
    """Restart ``cluster`` with pg_stat_statements loaded (pg_ctl restart keeps its start options)."""
    import psycopg

    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    _restart(cluster)
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        # Known only once the library is loaded.
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
        conn.execute("SELECT pg_reload_conf()")


async def drive(probes: dict[str, Probe], clients: int, seconds: float, rounds: int
                ) -> dict[str, tuple[int, dict[str, float]]]:
    for p in probes.values():
        await window(p.served, clients, min(seconds, 2.0), "legacy")
    totals: dict[str, tuple[int, dict[str, float]]] = {n: (0, {}) for n in probes}
    names = list(probes)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            before = probes[name].sample()
            w = await window(probes[name].served, clients, seconds, "legacy")
            after = probes[name].sample()
            done, spent = totals[name]
            for kind in after:
                spent[kind] = spent.get(kind, 0.0) + after[kind] - before.get(kind, 0.0)
            totals[name] = (done + w["completed"], spent)
            print(f"  round {r + 1} {name:<6} {w['completed'] / w['wall']:7.1f} programs/s", flush=True)
    return totals


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", action="store_true", help="also serve on the SQLite file store, for comparison")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--statements", action="store_true", help="load pg_stat_statements and list statements a program")
    p.add_argument("--durable", action="store_true",
                   help="fsync, synchronous_commit and full_page_writes on (docs/deploy.md), not off (tests/pg.py)")
    args = p.parse_args()
    import pg

    reason = pg.missing_reason()
    if reason:
        raise SystemExit(reason)
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent / "src"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    cluster = pg.start()
    probes: dict[str, Probe] = {}
    try:
        if args.durable:
            durable(cluster)
        if args.statements:
            with_statements(cluster)
        postmaster = int((cluster.directory / "data" / "postmaster.pid").read_text().split()[0])
        with tempfile.TemporaryDirectory(prefix="tether-pg-probe-") as tmp:
            config = Path(tmp) / "tether.toml"
            config.write_text("# tether's defaults: nothing set\n")
            argv = [sys.executable, str(HERE / "named_threads.py"), "tether.cli", "--config", str(config), "serve",
                    "--http", "127.0.0.1:{port}", "--dev", "--tools", str(HERE / "common.py")]
            probes["pg"] = Probe(Served("tether_pg", argv, {**env, "TETHER_HOME": f"{tmp}/home_pg",
                                                            "TETHER_STORE_URL": cluster.url}, Path(tmp) / "pg.log"),
                                 cluster.url, postmaster)
            if args.file:
                probes["file"] = Probe(Served("tether_file", argv, {**env, "TETHER_HOME": f"{tmp}/home_file"},
                                              Path(tmp) / "file.log"), None, None)
            try:
                for probe in probes.values():
                    probe.served.wait_listening()
                if args.statements:
                    with_reset = __import__("psycopg").connect(cluster.url, autocommit=True)
                    with with_reset:
                        with_reset.execute("SELECT pg_stat_statements_reset()")
                totals = asyncio.run(drive(probes, args.clients, args.seconds, args.rounds))
                listed = statements(cluster.url) if args.statements else []
            finally:
                for probe in probes.values():
                    probe.served.stop()
        every = {k for _, spent in totals.values() for k in spent}
        mains = sorted((k for k in every if not k.endswith(_SYS)),
                       key=lambda k: -max(totals[n][1].get(k, 0.0) / max(totals[n][0], 1) for n in totals))
        kinds = [k for main in mains for k in (main, f"{main}{_SYS}") if k in every]
        rows = []
        for kind in [*kinds, "total"]:
            row: dict[str, Any] = {"kind": kind}
            for name, (done, spent) in totals.items():
                value = (sum(v for k, v in spent.items() if not k.endswith(_SYS)) if kind == "total"
                         else spent.get(kind, 0.0))
                row[name] = round(value / max(done, 1) * 1e3, 3)
            rows.append(row)
        print()
        print(common.table(rows, [("kind", "CPU ms a program")] + [(n, n) for n in totals],
                           title="programs: " + ", ".join(f"{n} {d}" for n, (d, _) in totals.items())))
        if listed:
            # Per run started: the run INSERT's own count (warm-up included, and runs that ended after a window).
            runs = max(next((calls for query, calls, *_ in listed if query.startswith("INSERT INTO runs")), 1), 1)
            print()
            print(f"statements a run (pg_stat_statements over {runs} runs): calls, plans, mean execution and planning")
            for query, calls, plans, exec_ms, plan_ms in listed[:25]:
                print(f"  {calls / runs:6.2f}  plans {plans:6d}  exec {exec_ms / calls * 1e3:7.1f} µs"
                      f"  plan {plan_ms / max(plans, 1) * 1e3:7.1f} µs  {' '.join(query.split())[:150]}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
