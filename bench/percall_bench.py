"""One host call inside tether, two source trees side by side in the same run (issue 24, session 6).

Not run by run_all.py: the A/B behind bench/README.md's "Issue 24, session 6: one host call". Each tree gets
a worker process (``PYTHONPATH=<tree>/src``, as trees_bench.py) that runs the 10-call program with tether's
defaults (in-memory store) and times, per execute, the whole ``execute`` and the wall time spent inside
``EffectBoundary.call`` (the host call's path: replay check, validation, policy, journal, dispatch, outcome,
metrics), divided by the 10 calls. The tool itself does no I/O, so that wall time is the event loop's CPU.
Bare Monty ``feed_run`` of the same program runs in each worker as the floor. It reaches into the private
``tether._engine.calls.boundary.EffectBoundary``: both trees must have it (main from session 5 on).

``--rows N`` makes each call's result carry N records besides its value (a search's or a listing's page):
``--rows 50`` is a ~3.5 KB result.

    python bench/percall_bench.py [--rounds 300] [--warmup 30] [--rows 0] [--before COMMIT|DIR] [--after DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from trees_bench import EXPECTED, PROGRAM, ROOT, env_for, tree_of  # noqa: E402


async def worker(rows: int) -> None:
    import pydantic_monty as pm

    import tether
    from tether._engine.calls import boundary

    @tether.tool(namespace="bench", read_only=True)
    async def get(id: int) -> dict[str, int]:
        """Get one record by id."""
        if rows:
            return {"id": id, "value": id * 2, "rows": [{"id": i, "name": f"record {i}", "ok": True, "score": i / 4}
                                                         for i in range(rows)]}
        return {"id": id, "value": id * 2}

    inside = [0]
    original = boundary.EffectBoundary.call

    async def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.perf_counter_ns()
        try:
            return await original(self, *args, **kwargs)
        finally:
            inside[0] += time.perf_counter_ns() - t

    boundary.EffectBoundary.call = timed  # type: ignore[method-assign]
    modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": get})})}
    async with pm.AsyncMonty(min_processes=1, max_processes=2) as pool, tether.Runtime(tools=[get]) as rt:
        print(json.dumps({"ready": tether.__file__}), flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            t = time.perf_counter()
            async with pool.checkout(external_modules=modules) as s:
                assert await s.feed_run(PROGRAM) == EXPECTED
            bare = time.perf_counter() - t
            inside[0] = 0
            t = time.perf_counter()
            r = await rt.execute(PROGRAM)
            took = time.perf_counter() - t
            assert r.status == "completed" and r.result == EXPECTED, (r.status, r.error)
            print(json.dumps({"bare": bare, "execute": took, "call": inside[0] / 10 / 1e9}), flush=True)


class Worker:
    def __init__(self, tree: Path, rows: int) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(rows)],
                                     env=env_for(tree), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.file = json.loads(self._line())["ready"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a worker ended (exit {self.proc.wait()})")
        return line

    def sample(self) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("x\n")
        self.proc.stdin.flush()
        return json.loads(self._line())  # type: ignore[no-any-return]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    import common

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--before", required=True, help="a commit or a folder holding src/tether")
    p.add_argument("--after", default=str(ROOT), help="a folder holding src/tether (default: this checkout)")
    p.add_argument("--rows", type=int, default=0, help="records in each call's result besides its value")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="percall-bench-"))
    try:
        trees = {"before": tree_of(args.before, scratch), "after": tree_of(args.after, scratch)}
        workers = {k: Worker(t, args.rows) for k, t in trees.items()}
        for k, w in workers.items():
            print(f"{k}: {trees[k]} (imports {w.file})")
        got: dict[str, dict[str, list[float]]] = {k: {"bare": [], "execute": [], "call": []} for k in trees}
        for r in range(args.warmup + args.rounds):
            for side in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
                s = workers[side].sample()
                if r >= args.warmup:
                    for name, v in s.items():
                        got[side][name].append(v)
        for w in workers.values():
            w.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = []
    for name in ("call", "execute", "bare"):
        b, a = got["before"][name], got["after"][name]
        rows.append({"measure": name, "before_p50_us": round(statistics.median(b) * 1e6, 1),
                     "after_p50_us": round(statistics.median(a) * 1e6, 1),
                     "paired": round(common.paired_ratio(a, b), 3)})
    for side in ("before", "after"):
        x = common.paired_ratio(got[side]["execute"], got[side]["bare"])
        rows.append({"measure": f"execute x bare, {side}", "paired": round(x, 3)})
    print(common.table(rows, [("measure", "measure"), ("before_p50_us", "before p50 µs"),
                              ("after_p50_us", "after p50 µs"), ("paired", "after/before (paired)")],
                       title=f"=== one host call: after ({args.after}) against before ({args.before}), "
                             f"{args.rounds} rounds, {args.rows} records a result"))
    common.emit("percall", False, {"rounds": args.rounds, "before": args.before, "result_rows": args.rows,
                                   "rows": rows, "targets": []})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        asyncio.run(worker(int(sys.argv[2])))
    else:
        main()
