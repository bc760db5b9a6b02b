"""What serving adds to the engine's own cost: a served program's CPU by thread, for the floor, the engine peer and tether.

Starts, each with its Python threads named for the OS (bench/named_threads.py) and
the collector's passes counted (``gc.callbacks``, read by SIGUSR2):

- ``floor``: serve_peers.py's SDK server running bare Monty;
- ``engine``: the same server running tether's ``Runtime.execute`` (its defaults:
  the SQLite file store);
- ``engine_mem``: the engine peer on ``sqlite:///:memory:`` (the store the
  in-process figures use);
- ``tether_file``: ``tether serve --http --dev`` with its defaults;
- ``tether_mem``: the same on ``sqlite:///:memory:``;

then drives serve_bench.py's clients in alternating windows (pg_serve_probe.py's
rounds) and prints CPU milliseconds a program by thread kind (``loop`` is the
main thread: the event loop; ``tokio-runtime-w`` Monty's threads; ``workers`` the
Monty worker processes), and the collector's passes and milliseconds a program.

    python bench/serve_probe.py [--only floor,engine,tether_file] [--clients 16] [--seconds 4] [--rounds 3]

A probe, not run by run_all.py (bench/README.md "Issue 24, session 8: what serving adds").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from pg_serve_probe import _SYS, children_cpu, thread_cpu
from serve_bench import Served, window

HERE = Path(__file__).resolve().parent
KINDS = ("floor", "engine", "engine_mem", "tether_file", "tether_mem", "inproc_bare", "inproc_tether",
         "inproc_tether_mem")
MEMORY = "sqlite:///:memory:"


class Probe:
    def __init__(self, served: Served, gc_path: Path) -> None:
        self.served, self.gc_path = served, gc_path

    def collector(self) -> dict[str, float]:
        """The server's collector totals: passes and seconds, by generation and all together."""
        before = self.gc_path.stat().st_mtime_ns if self.gc_path.exists() else 0
        os.kill(self.served.proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while not self.gc_path.exists() or self.gc_path.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.005)
        totals = json.loads(self.gc_path.read_text())
        self.young, self.samples = totals.pop("young", {}), totals.pop("samples", 0)
        self.cyclic = totals.pop("cyclic", {})
        self.timers = totals.pop("timers", [])
        out = {f"gc gen{g} passes": float(v[0]) for g, v in totals.items()}
        out.update({f"gc gen{g} s": v[1] / 1e9 for g, v in totals.items()})
        out["gc s"] = sum(v[1] for v in totals.values()) / 1e9
        return out

    async def window(self, clients: int, seconds: float) -> dict[str, Any]:
        return await window(self.served, clients, seconds, "legacy")

    def sample(self) -> dict[str, float]:
        pid = self.served.proc.pid
        out = thread_cpu(pid)
        out["workers"] = children_cpu(pid)
        # Measured, not CPU of a thread of its own: kept apart from the total by its prefix.
        out.update({f"~{k}": v for k, v in self.collector().items()})
        return out


class InProcess:
    """One process running the engine (file store) and bare Monty without a server (engine_concurrency.py --stdin).

    Its windows alternate with the servers', so "what serving adds" is read against the engine's own cost
    measured at the same moments, on the same loaded machine.
    """

    def __init__(self, env: dict[str, str], clients: int, store: str) -> None:
        import subprocess

        self.proc = subprocess.Popen([sys.executable, str(HERE / "engine_concurrency.py"), "--stdin", "--concurrency",
                                      str(clients), "--store", store], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.spent: dict[str, dict[str, float]] = {}

    def ready(self) -> None:
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("engine_concurrency.py --stdin did not start")

    def run(self, way: str, seconds: float) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{way} {seconds}\n")
        self.proc.stdin.flush()
        out: dict[str, Any] = json.loads(self.proc.stdout.readline())
        spent = self.spent.setdefault(way, {"loop": 0.0, "other threads": 0.0, "~gc s": 0.0})
        spent["loop"] += out["main"]
        spent["other threads"] += out["cpu"] - out["main"]
        spent["~gc s"] += out["gc"]
        return {"completed": out["completed"], "wall": seconds}

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class InProcessWay:
    def __init__(self, shared: InProcess, way: str) -> None:
        self.shared, self.way = shared, way

    async def window(self, clients: int, seconds: float) -> dict[str, Any]:
        return await asyncio.to_thread(self.shared.run, self.way, seconds)

    def sample(self) -> dict[str, float]:
        return dict(self.shared.spent.get(self.way, {}))


async def drive(probes: dict[str, Any], clients: int, seconds: float, rounds: int
                ) -> dict[str, tuple[int, dict[str, float]]]:
    """pg_serve_probe.py's rounds: a warm-up window each, then rounds in rotated order."""
    for p in probes.values():
        await p.window(clients, min(seconds, 2.0))
    totals: dict[str, tuple[int, dict[str, float]]] = {n: (0, {}) for n in probes}
    names = list(probes)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            before = probes[name].sample()
            w = await probes[name].window(clients, seconds)
            after = probes[name].sample()
            done, spent = totals[name]
            for kind in after:
                spent[kind] = spent.get(kind, 0.0) + after[kind] - before.get(kind, 0.0)
            totals[name] = (done + w["completed"], spent)
            print(f"  round {r + 1} {name:<13} {w['completed'] / w['wall']:7.1f} programs/s", flush=True)
    return totals


async def spy(probes: dict[str, Probe], out: Path, clients: int, seconds: float) -> None:
    """One more window a server with py-spy sampling it (its overhead is its own, so apart from the totals)."""
    import subprocess

    from serve_bench import window

    out.mkdir(parents=True, exist_ok=True)
    for name, probe in probes.items():
        if not isinstance(probe, Probe):
            continue
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                str(probe.served.proc.pid), "--format", "raw", "--threads", "--gil", "--rate", "500",
                                "--duration", str(int(seconds)), "--output", str(out / f"{name}.txt")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        w = await window(probe.served, clients, seconds, "legacy")
        await asyncio.to_thread(spy.wait)
        print(f"  spied {name}: {w['completed']} programs -> {out / f'{name}.txt'}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="floor,engine,tether_file", help="comma-separated subset of " + ", ".join(KINDS))
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--spy", default=None, metavar="DIR",
                   help="py-spy record (collapsed stacks, samples holding the GIL) one more window a server into DIR")
    p.add_argument("--young", type=int, default=0, metavar="N",
                   help="list the N commonest types in the young generations at the samples")
    p.add_argument("--cyclic", type=int, default=0, metavar="N",
                   help="keep what the collector frees (gc.DEBUG_SAVEALL; slows the servers) and list the N "
                        "commonest types a program")
    p.add_argument("--src", default=str(HERE.parent / "src"), help="the src folder to serve tether from")
    args = p.parse_args()
    only = args.only.split(",")
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), args.src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    named = [sys.executable, str(HERE / "named_threads.py")]
    probes: dict[str, Any] = {}
    inprocs: dict[str, InProcess] = {}
    with tempfile.TemporaryDirectory(prefix="tether-serve-probe-") as tmp:
        config = Path(tmp) / "tether.toml"
        config.write_text("# tether's defaults: nothing set\n")
        tether = [*named, "tether.cli", "--config", str(config), "serve", "--http", "127.0.0.1:{port}", "--dev",
                  "--tools", str(HERE / "common.py")]
        for kind in only:
            if kind.startswith("inproc"):
                # inproc_bare and inproc_tether share one process (the file store); inproc_tether_mem has its own.
                store = "memory" if kind.endswith("_mem") else "file"
                if store not in inprocs:
                    inprocs[store] = InProcess({**env, "TETHER_HOME": f"{tmp}/home_inproc_{store}"}, args.clients,
                                               store)
                probes[kind] = InProcessWay(inprocs[store], kind.split("_")[1])
                continue
            argv = tether if kind.startswith("tether") else [*named, "serve_peers", kind.split("_")[0], "{port}"]
            extra = {"TETHER_STORE_URL": MEMORY} if kind.endswith("_mem") else {}
            gc_path = Path(tmp) / f"{kind}.gc.json"
            probes[kind] = Probe(Served(kind, argv, {**env, **extra, "TETHER_HOME": f"{tmp}/home_{kind}",
                                                     "NAMED_THREADS_GC": str(gc_path),
                                                     **({"NAMED_THREADS_SAVEALL": "1"} if args.cyclic else {})}, Path(tmp) / f"{kind}.log"),
                                 gc_path)
        try:
            for probe in probes.values():
                if isinstance(probe, Probe):
                    probe.served.wait_listening()
            for inproc in inprocs.values():
                inproc.ready()
            totals = asyncio.run(drive(probes, args.clients, args.seconds, args.rounds))
            if args.spy:
                asyncio.run(spy(probes, Path(args.spy), args.clients, args.seconds))
        finally:
            for probe in probes.values():
                if isinstance(probe, Probe):
                    probe.served.stop()
            for inproc in inprocs.values():
                inproc.stop()
    every = {k for _, spent in totals.values() for k in spent}
    mains = sorted((k for k in every if not k.endswith(_SYS) and not k.startswith("~")),
                   key=lambda k: -max(totals[n][1].get(k, 0.0) / max(totals[n][0], 1) for n in totals))
    kinds = [k for main in mains for k in (main, f"{main}{_SYS}") if k in every]
    rows = []
    for kind in [*kinds, "total", *sorted(k for k in every if k.startswith("~"))]:
        row: dict[str, Any] = {"kind": kind.lstrip("~")}
        for name, (done, spent) in totals.items():
            value = (sum(v for k, v in spent.items() if not k.endswith(_SYS) and not k.startswith("~"))
                     if kind == "total" else spent.get(kind, 0.0))
            # Passes a program as they are; seconds as milliseconds a program.
            row[name] = round(value / max(done, 1) * (1 if kind.endswith("passes") else 1e3), 3)
        rows.append(row)
    for name, probe in probes.items():
        if isinstance(probe, Probe) and probe.timers:
            print(f"{name}: the loop's timer heap at each sample (timers, of them cancelled): "
                  + " ".join(f"{n}/{c}" for n, c in probe.timers))
    if args.young:
        for name, probe in probes.items():
            if not isinstance(probe, Probe):
                continue
            print(f"{name}: young generations' objects, mean over {probe.samples} samples, by type")
            for t, n in sorted(probe.young.items(), key=lambda kv: -kv[1])[:args.young]:
                print(f"  {n / max(probe.samples, 1):8.1f}  {t}")
    if args.cyclic:
        for name, (done, _) in totals.items():
            if not isinstance(probes[name], Probe):
                continue
            cyclic = probes[name].cyclic
            print(f"{name}: objects only the collector freed, a program ({sum(cyclic.values()) / done:.1f} in all)")
            for t, n in sorted(cyclic.items(), key=lambda kv: -kv[1])[:args.cyclic]:
                print(f"  {n / done:8.2f}  {t}")
    print()
    print(common.table(rows, [("kind", "CPU ms a program")] + [(n, n) for n in totals],
                       title="programs: " + ", ".join(f"{n} {d}" for n, (d, _) in totals.items())
                       + f"; load average {os.getloadavg()[0]:.1f}"))


if __name__ == "__main__":
    main()
