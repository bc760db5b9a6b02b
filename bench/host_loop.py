"""One host call in a tight loop, for several source trees side by side (issue 24, session 7).

Not run by run_all.py: the probe behind bench/README.md's "Issue 24, session 7: one host call" per-change
table. In place (``percall_bench.py``, ``hop_probe.py``) a host call's path moves with the machine's load by
more than most single changes to it are worth; here the call is repeated where the sandbox makes it, so the
caches stay warm and the differences show. Each tree gets a process (``PYTHONPATH=<tree>/src``, as
trees_bench.py): a 1-call program whose one host call runs ``EffectBoundary.host`` ``--calls`` times in a row
(limits raised), the p50 of those calls taken per execute, the lowest of ``--executes`` executes printed.
Tight-loop figures are 2-3x lower than in place (warm caches, no worker round trip between calls); read them
as the change's share, and the in-place benches for what a run sees.

    python bench/host_loop.py [--passes 3] [--calls 2000] [--executes 7] TREE [TREE ...]

A TREE is a commit (its ``src`` by ``git archive``) or a folder holding ``src/tether``; the trees are run in
turn, ``--passes`` times.
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
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from trees_bench import env_for, tree_of  # noqa: E402


async def worker(calls: int, executes: int) -> None:
    import tether
    from tether._engine.calls import boundary

    @tether.tool(namespace="bench", read_only=True)
    async def get(id: int) -> dict[str, int]:
        """Get one record by id."""
        return {"id": id, "value": id * 2}

    took: list[int] = []
    original = boundary.EffectBoundary.host

    async def looped(self: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        value = None
        for _ in range(calls):
            t = time.perf_counter_ns()
            value = await original(self, name, args, kwargs)
            took.append(time.perf_counter_ns() - t)
        return value

    boundary.EffectBoundary.host = looped  # type: ignore[method-assign,assignment]
    p50s = []
    async with tether.Runtime(tools=[get], limits=tether.Limits(host_calls=calls + 1)) as rt:
        for _ in range(executes):
            took.clear()
            r = await rt.execute("import tools\n(await tools.bench.get(id=1))['value']")
            assert r.status == "completed" and r.result == 2, r.error
            p50s.append(statistics.median(took) / 1e3)
    print(json.dumps({"file": tether.__file__, "p50_us": min(p50s)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--executes", type=int, default=7)
    p.add_argument("trees", nargs="+", help="commits or folders holding src/tether")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="host-loop-"))
    try:
        trees = {spec: tree_of(spec, scratch) for spec in args.trees}
        got: dict[str, list[float]] = {spec: [] for spec in trees}
        for _ in range(args.passes):
            for spec, tree in trees.items():
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(args.calls),
                                      str(args.executes)], env=env_for(tree), capture_output=True, text=True,
                                     check=True).stdout
                line = json.loads(out.strip().splitlines()[-1])
                if not line["file"].startswith(str(tree)):
                    raise SystemExit(f"the worker for {tree} imported {line['file']}")
                got[spec].append(line["p50_us"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    first = statistics.median(got[args.trees[0]])
    print(f"=== one host call in a tight loop, µs (p50 of {args.calls} calls, lowest of {args.executes} executes; "
          f"{args.passes} passes)")
    print(f"{'tree':<14} {'median':>8} {'x first':>8}  passes")
    for spec, xs in got.items():
        m = statistics.median(xs)
        print(f"{spec[:14]:<14} {m:8.2f} {m / first:8.3f}  {' '.join(f'{x:.2f}' for x in xs)}")
    print(json.dumps({"bench": "host_loop", "passes": args.passes, "calls": args.calls,
                      "trees": {k: round(statistics.median(v), 2) for k, v in got.items()}}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        asyncio.run(worker(int(sys.argv[2]), int(sys.argv[3])))
    else:
        main()
