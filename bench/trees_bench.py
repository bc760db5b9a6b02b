"""Two source trees of tether measured against each other in the same run (issue 21: the redesign, before/after).

Both trees are the package ``tether``, so one process cannot hold both: each tree gets a worker process
(``PYTHONPATH=<tree>/src``, this venv's interpreter and dependencies) that warms up and then times one
sample at a time on request. The parent asks the two workers in turn, the order of trees and of workloads
rotated every round, so a noisy neighbour on the shared machine falls on both sides of a pair. Only the
public API both trees have is used (``tether.Runtime``, ``tether.tool``, ``tether.store.open_store``,
``execute``, ``resume``), so the workload is the same code on both sides.

Workloads, per tree:
  bare       bare Monty ``feed_run`` of the 10-call program (core_bench's baseline). The same code in both
             workers: its after/before ratio is the noise floor of the pairing.
  execute    ``Runtime.execute`` of the 10-call program, default settings, in-memory store.
  execute_db the same with the journal in a SQLite file and type check off (durable_bench's (iii)).
  pause      one read then a write: ``execute`` to the pause (SQLite file).
  resume     ``resume(run_id, "approve")`` of such a paused run, restored from its snapshot, to completion.
  cold_start ``tether run one.py`` of ``1 + 1`` as a fresh process (no tether.toml: no sources), bytecode cached;
             wall time, and (cold_start_cpu) the child's user + system CPU time.

    python bench/trees_bench.py [--quick] [--rounds N] [--warmup N] [--before 97d6cdf|DIR] [--after DIR]

``--before`` is a commit (its ``src`` is taken with ``git archive`` into a temporary folder) or a folder
holding ``src/tether``; the default is 97d6cdf, the start of session 5 (the old layout ``tether.runs``).
``--after`` defaults to this checkout. Without git or that commit the bench prints a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_BEFORE = "97d6cdf"
WORKLOADS = ("bare", "execute", "execute_db", "pause", "resume")
PROGRAM = """\
import tools
total = 0
for i in range(10):
    r = await tools.bench.get(id=i)
    total += r["value"]
total
"""
EXPECTED = sum(i * 2 for i in range(10))
PAUSING = 'import tools\nr = await tools.bench.get(id=1)\nw = await tools.bench.put(id=1, value="x")\nw["stored"]\n'


# --- the worker: imports whichever tether its PYTHONPATH gives it -------------------------------------------


async def worker() -> None:
    import pydantic_monty as pm

    import tether
    from tether.store import open_store

    @tether.tool(namespace="bench", read_only=True)
    async def get(id: int) -> dict[str, int]:
        """Get one record by id."""
        return {"id": id, "value": id * 2}

    @tether.tool(namespace="bench", destructive=True)
    async def put(id: int, value: str) -> dict[str, Any]:
        """Store a value under an id (a write: the default policy asks before it is sent)."""
        return {"id": id, "value": value, "stored": True}

    tmp = tempfile.mkdtemp(prefix="trees-bench-")
    modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": get})})}
    paused: list[str] = []
    async with pm.AsyncMonty(min_processes=1, max_processes=2) as pool, \
            tether.Runtime(tools=[get, put]) as mem, \
            tether.Runtime(tools=[get, put], store=open_store(f"sqlite:///{tmp}/j.db"), type_check=False) as db:

        async def bare() -> None:
            async with pool.checkout(external_modules=modules) as s:
                r = await s.feed_run(PROGRAM)
            assert r == EXPECTED, r

        async def execute(rt: Any) -> None:
            r = await rt.execute(PROGRAM)
            assert r.status == "completed" and r.result == EXPECTED, (r.status, r.error)

        async def pause() -> None:
            r = await db.execute(PAUSING)
            assert r.status == "paused", (r.status, r.error)
            paused.append(r.run_id)

        async def resume() -> None:
            if not paused:  # resume needs a paused run: make one outside the timed part
                raise RuntimeError("resume before pause")
            r = await db.resume(paused.pop(), "approve")
            assert r.status == "completed" and r.result is True, (r.status, r.error)

        jobs = {"bare": bare, "execute": lambda: execute(mem), "execute_db": lambda: execute(db),
                "pause": pause, "resume": resume}
        print(json.dumps({"ready": tether.__file__}), flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            name = line.strip()
            if name == "resume" and not paused:
                await pause()
            t = time.perf_counter()
            await jobs[name]()
            print(json.dumps({"s": time.perf_counter() - t}), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


# --- the parent --------------------------------------------------------------------------------------------


def tree_of(spec: str, scratch: Path) -> Path:
    """A folder holding src/tether for ``spec``: a folder as it is, or a commit's src by git archive."""
    if (Path(spec) / "src" / "tether").is_dir():
        return Path(spec).resolve()
    out = scratch / spec.replace("/", "_")
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", spec, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    # An installed tether starts from bytecode; both trees get theirs written (see common.tether_run_once).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("TETHER_STORE_URL", None)
    return env


class Worker:
    def __init__(self, tree: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"], env=env_for(tree),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self._line())
        self.file = ready["ready"]
        if not self.file.startswith(str(tree)):
            raise SystemExit(f"the worker for {tree} imported {self.file}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a worker ended (exit {self.proc.wait()})")
        return line

    def sample(self, name: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return float(json.loads(self._line())["s"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def cold_start(tree: Path, cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system of the child) of one `tether run one.py`.

    CPU is the steadier figure on a shared machine: waiting for a core counts in wall time only.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "tether"), "run", "one.py"], cwd=cwd,
                          env=dict(env_for(tree), TETHER_HOME=str(cwd / "home")), capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0 or proc.stdout.strip() != "2":
        raise SystemExit(f"tether run failed with {tree}: {proc.stdout}{proc.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    sys.path.insert(0, str(HERE))
    import common

    p = common.parser(__doc__.splitlines()[0], rounds=200, quick_rounds=10)
    p.add_argument("--before", default=DEFAULT_BEFORE, help="a commit or a folder holding src/tether")
    p.add_argument("--after", default=str(ROOT), help="a folder holding src/tether (default: this checkout)")
    p.add_argument("--cold-every", type=int, default=None,
                   help="a cold-start pair every N rounds (default 4, 1 with --quick)")
    args = p.parse_args()
    rounds, warmup = common.rounds_of(args)
    cold_every = args.cold_every or (1 if args.quick else 4)
    scratch = Path(tempfile.mkdtemp(prefix="trees-bench-"))
    try:
        try:
            trees = {"before": tree_of(args.before, scratch), "after": tree_of(args.after, scratch)}
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            print(f"skipped: cannot get the trees ({exc})")
            common.emit("trees", args.quick, {"skipped": str(exc), "targets": []})
            return
        workers = {k: Worker(t) for k, t in trees.items()}
        for k, w in workers.items():
            print(f"{k}: {trees[k]} (imports {w.file})")
        dirs = {}
        for k in trees:
            d = scratch / f"cold-{k}"
            d.mkdir()
            (d / "one.py").write_text("1 + 1\n")
            dirs[k] = d
        samples: dict[str, dict[str, list[float]]] = {w: {"before": [], "after": []}
                                                      for w in WORKLOADS + ("cold_start", "cold_start_cpu")}
        for r in range(warmup + rounds):
            names = list(WORKLOADS)
            names = names[r % len(names):] + names[:r % len(names)]
            sides = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in names:
                for side in sides:
                    took = workers[side].sample(name)
                    if r >= warmup:
                        samples[name][side].append(took)
            # Two warm-up starts write both trees' bytecode; then a pair every cold_every measured rounds.
            if r < min(warmup, 2) or (r >= warmup and (r - warmup) % cold_every == 0):
                for side in sides:
                    took, cpu = cold_start(trees[side], dirs[side])
                    if r >= warmup:
                        samples["cold_start"][side].append(took)
                        samples["cold_start_cpu"][side].append(cpu)
        for w in workers.values():
            w.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    rows = []
    for name, by in samples.items():
        b, a = common.stats(by["before"]), common.stats(by["after"])
        row = {"workload": name, "n": a.n,
               "before_p50_ms": round(b.p50 * 1e3, 3), "before_p10_p90_ms": f"{b.p10 * 1e3:.3f}-{b.p90 * 1e3:.3f}",
               "after_p50_ms": round(a.p50 * 1e3, 3), "after_p10_p90_ms": f"{a.p10 * 1e3:.3f}-{a.p90 * 1e3:.3f}",
               "ratio": round(a.p50 / b.p50, 3), "paired_ratio": round(common.paired_ratio(by["after"], by["before"]), 3)}
        if name in ("execute", "execute_db"):
            for side in ("before", "after"):
                row[f"{side}_x_bare"] = round(common.paired_ratio(by[side], samples["bare"][side]), 3)
        rows.append(row)
    cols = [("workload", "workload"), ("n", "n"), ("before_p50_ms", "before p50 ms"),
            ("before_p10_p90_ms", "p10-p90"), ("after_p50_ms", "after p50 ms"), ("after_p10_p90_ms", "p10-p90"),
            ("ratio", "after/before p50"), ("paired_ratio", "x paired"),
            ("before_x_bare", "before x bare"), ("after_x_bare", "after x bare")]
    print(common.table(rows, cols, title=f"=== after ({args.after}) against before ({args.before}), same run"))
    # No slowdown (issue 21): each tether workload's paired after/before at most 1.10 (bare's is the noise floor).
    targets = [common.target(f"{r['workload']} after/before (paired)", r["paired_ratio"], 1.10, "x")
               for r in rows if r["workload"] != "bare"]
    common.emit("trees", args.quick, {"rounds": rounds, "warmup": warmup, "before": args.before, "rows": rows,
                                      "targets": targets})


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        asyncio.run(worker())
    else:
        main()
